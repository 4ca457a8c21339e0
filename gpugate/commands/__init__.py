"""The `gpugate` commands, a module each, and what only they use: the control API's client
(`control_client.py`), the tokens a command finds on this machine (`local_token.py`) and
the exit codes (`exits.py`).

A command module has `add_parser(subparsers)`, which adds its subcommand (or, for a family
such as `views` and `operator`, its subcommands), and `run(args) -> int`, which runs it and
returns the exit code. `gpugate.cli` holds the table of commands, name → module, and builds
the parser and dispatches through it. A module imports what is slow to import, or only its
command needs (the gate for `serve`, the simulator for `demo` and `sim`), inside `run`.
"""

from __future__ import annotations

import argparse
from typing import Protocol


class Command(Protocol):
    """What the table in gpugate.cli holds for each name: a command module."""

    def add_parser(self, subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
        """Add the module's subcommands to `gpugate`'s parser."""

    def run(self, args: argparse.Namespace) -> int:
        """Run the parsed command; its exit code."""
