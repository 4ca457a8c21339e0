"""The commands are the top floor: no module of gpugate below them imports one (the status
document the gate serves and `gpugate status` prints is control's, not the command's), no
command imports another (what several use is the client, the tokens and the exit codes),
and the simulator is imported by the two commands that run it, nothing else."""

from __future__ import annotations

from tests.seam.test_no_import_cycles import import_graph

SHARED = {
    "gpugate.commands",
    "gpugate.commands.control_client",
    "gpugate.commands.exits",
    "gpugate.commands.local_token",
}
"""The modules of gpugate.commands that are not commands: what the commands share."""


def importers(prefix: str) -> set[str]:
    """The modules outside `prefix` that import a module under it."""
    return {
        module
        for module, imported in import_graph().items()
        if not module.startswith(prefix)
        and any(name == prefix or name.startswith(prefix + ".") for name in imported)
    }


def test_only_the_program_imports_a_command():
    assert importers("gpugate.commands") == {"gpugate.cli"}
    assert importers("gpugate.cli") == {"gpugate.__main__"}


def test_no_command_imports_another():
    graph = import_graph()
    commands = {m for m in graph if m.startswith("gpugate.commands.")} - SHARED
    assert {"gpugate.commands.status", "gpugate.commands.views"} <= commands
    borrowed = {m: sorted((graph[m] & commands) - {m}) for m in commands}
    assert {m: names for m, names in borrowed.items() if names} == {}


def test_the_simulator_is_imported_by_the_demo_and_sim_commands_only():
    assert importers("gpugate.sim") == {"gpugate.commands.demo", "gpugate.commands.sim"}
