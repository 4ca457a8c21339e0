"""The simulator is a package of its own (gpugate_sim), beside gpugate in one distribution,
and the two touch in two places only, read from the imports of every module of both (ast):

* gpugate imports the simulator in the two commands that run it, `gpugate demo` and
  `gpugate sim`, and there only inside a function, so that building the parser (which
  imports every command module) does not import it. Nothing else in gpugate names it: the
  gate sees a simulated host only through the fake libnvidia-ml.so.1 and the runtimes' HTTP
  APIs, as it sees a real one.
* The simulator imports from gpugate only gpugate.core.units (sizes and durations as the
  host file and the configuration write them). Its readers of the runtimes' requests (Go's
  JSON and templates for Ollama, nlohmann for llama-server, ComfyUI's validation) are its
  own: they are the independent check the adapters in gpugate/runtimes/ are tested against,
  and code shared between the two would make them agree by construction.
"""

from __future__ import annotations

import ast

from tests.seam.test_no_import_cycles import PACKAGES, ROOT, import_graph, module_name

SIMULATOR = "gpugate_sim"
RUNNING_IT = {"gpugate.commands.demo", "gpugate.commands.sim"}
"""The only modules of gpugate that import the simulator: the commands that run it."""
FROM_GPUGATE = {"gpugate.core.units"}
"""All the simulator may import from gpugate; fewer is fine, more is not."""


def _under(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def test_only_the_commands_that_run_it_import_the_simulator():
    graph = import_graph()
    importers = {
        module
        for module, imported in graph.items()
        if _under(module, "gpugate") and any(_under(name, SIMULATOR) for name in imported)
    }
    assert importers == RUNNING_IT


def test_the_commands_import_the_simulator_only_when_they_run():
    for module in sorted(RUNNING_IT):
        path = ROOT.joinpath(*module.split(".")).with_suffix(".py")
        tree = ast.parse(path.read_text())
        on_import = [n.lineno for n in _run_on_import(tree) if _names_simulator(n)]
        anywhere = [n.lineno for n in ast.walk(tree) if _names_simulator(n)]
        assert on_import == [], f"{module} imports the simulator when imported: {on_import}"
        assert anywhere, f"{module} no longer imports the simulator: RUNNING_IT is stale"


def test_the_guard_sees_an_import_at_the_top_and_not_one_in_a_function():
    tree = ast.parse(
        "import gpugate_sim.host\n"
        "if True:\n    from gpugate_sim import hostprocess\n"
        "def run():\n    from gpugate_sim.host import run_host\n"
    )
    assert sorted(n.lineno for n in _run_on_import(tree) if _names_simulator(n)) == [1, 3]


def test_the_simulator_takes_only_units_from_gpugate():
    graph = import_graph()
    simulator = {m for m in graph if _under(m, SIMULATOR)}
    assert len(simulator) > 100, "the walker does not see the simulator's modules"
    taken = {
        f"{module} -> {name}"
        for module in simulator
        for name in graph[module]
        if _under(name, "gpugate") and name not in FROM_GPUGATE
    }
    assert taken == set()
    assert "gpugate.core.units" in graph["gpugate_sim.specfields"]


def test_the_walker_reads_both_packages():
    assert {p.name for p in PACKAGES} == {"gpugate", SIMULATOR}
    assert module_name(ROOT / "gpugate_sim" / "whisper" / "__init__.py") == "gpugate_sim.whisper"


def _run_on_import(tree: ast.Module) -> list[ast.AST]:
    """The nodes that run when the module is imported: all but the bodies of functions."""
    found: list[ast.AST] = []
    todo: list[ast.AST] = list(tree.body)
    while todo:
        node = todo.pop()
        found.append(node)
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            todo.extend(ast.iter_child_nodes(node))
    return found


def _names_simulator(node: ast.AST) -> bool:
    """Whether `node` is an import of the simulator or of a module of it."""
    if isinstance(node, ast.Import):
        return any(_under(alias.name, SIMULATOR) for alias in node.names)
    if isinstance(node, ast.ImportFrom):
        return node.level == 0 and _under(node.module or "", SIMULATOR)
    return False
