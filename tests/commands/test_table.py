"""The `gpugate` program is its table of commands: the parser lists exactly the table's
names, in its order, and each name runs its own module's `run`; building the parser imports
neither the gate nor the simulator."""

from __future__ import annotations

import argparse
import subprocess
import sys

import pytest

from gpugate import cli

ARGUMENTS = {
    "check": [],
    "status": ["--watch"],
    "serve": [],
    "lease": ["--consumer", "ollama", "--bytes", "1GiB", "--", "true"],
    "admit": ["whisper", "--", "true"],
    "leases": [],
    "events": ["--follow"],
    "envelopes": [],
    "evict": ["ollama", "bge-m3"],
    "drain": ["comfyui"],
    "undrain": ["comfyui"],
    "pause": ["--gpu", "0"],
    "resume": [],
    "init": ["--dry-run"],
    "share": ["systemd/gpugate.service"],
    "sim": ["run", "host.yaml"],
    "demo": ["--two-cards"],
}
"""A command line each command's parser accepts."""


class Recorder:
    """A command module whose `run` records the command it was given instead of running it."""

    def __init__(self, module: cli.Command, ran: list[str]) -> None:
        self.module = module
        self.ran = ran

    def add_parser(self, subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
        self.module.add_parser(subparsers)

    def run(self, args: argparse.Namespace) -> int:
        self.ran.append(f"{self.module.__name__}:{args.command}")  # type: ignore[attr-defined]
        return 42


def subcommands(parser: argparse.ArgumentParser) -> list[str]:
    (action,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return list(action.choices)


def test_the_parser_lists_the_tables_commands_in_its_order():
    assert subcommands(cli._parser()) == list(cli.COMMANDS)
    assert set(ARGUMENTS) == set(cli.COMMANDS)


@pytest.mark.parametrize("name", list(cli.COMMANDS))
def test_a_command_runs_its_own_modules_run(name, monkeypatch):
    ran: list[str] = []
    recorders = {module: Recorder(module, ran) for module in set(cli.COMMANDS.values())}
    table = {command: recorders[module] for command, module in cli.COMMANDS.items()}
    monkeypatch.setattr(cli, "COMMANDS", table)
    assert cli.main([name, *ARGUMENTS[name]]) == 42
    assert ran == [f"{cli.COMMANDS[name].module.__name__}:{name}"]
    assert ran[0].startswith("gpugate.commands.")


def test_building_the_parser_imports_neither_the_gate_nor_the_simulator():
    # A process of its own: this one has imported the simulator for its fixtures.
    script = (
        "import sys\n"
        "from gpugate.cli import _parser\n"
        "_parser()\n"
        "print('\\n'.join(sorted(m for m in sys.modules if m.startswith('gpugate'))))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True
    )
    loaded = done.stdout.split()
    assert "gpugate.commands.demo" in loaded and "gpugate.cli" in loaded
    heavy = ("gpugate_sim", "gpugate.gate", "gpugate.proxy", "gpugate.runtimes", "gpugate.serve")
    assert [m for m in loaded if m.startswith(heavy)] == []
