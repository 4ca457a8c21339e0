"""config/ stands on core/ alone: no module of it imports a floor above it (runtimes/, gate/,
the commands), counting imports made only for type checking. The runtimes a file may name
reach the loader as a table its caller hands in."""

from __future__ import annotations

from tests.seam.test_no_import_cycles import import_graph

CONFIG = "gpugate.config"
BELOW = (CONFIG, "gpugate.core")
"""What config/ may import: itself and the floor beneath it."""


def _within(module: str, package: str) -> bool:
    return module == package or module.startswith(f"{package}.")


def imports_above(graph: dict[str, set[str]]) -> list[str]:
    """`module -> target` for each import of a config/ module outside config/ and core/."""
    return sorted(
        f"{module} -> {target}"
        for module, targets in graph.items()
        if _within(module, CONFIG)
        for target in targets
        if not any(_within(target, floor) for floor in BELOW)
    )


def test_the_guard_finds_an_import_above():
    graph = {
        "gpugate.config.loader": {"gpugate.config.model", "gpugate.runtimes.sections"},
        "gpugate.config.model": {"gpugate.core.units"},
        "gpugate.runtimes.sections": {"gpugate.config.loader"},
        "gpugate.configure": {"gpugate.gate.gate"},
    }
    assert imports_above(graph) == ["gpugate.config.loader -> gpugate.runtimes.sections"]


def test_config_imports_nothing_above_it():
    graph = import_graph()
    assert imports_above(graph) == []
    assert "gpugate.core.units" in graph["gpugate.config.model"]
