"""The `gpugate` program: the table of its commands, the parser built from it, and `main`.

Each command is a module of gpugate.commands (`add_parser`, `run`). Exit codes are
commands/exits.py's (sysexits): 64 for a command line argparse refuses, 78 for a command
whose configuration is named and not there, or found nowhere (gpugate.config.paths, the one
lookup every command that reads a configuration uses).
"""

from __future__ import annotations

import argparse
import sys
from typing import NoReturn

from gpugate.commands import (
    Command,
    admit,
    check,
    demo,
    init,
    lease,
    operator,
    serve,
    share,
    sim,
    status,
    views,
)
from gpugate.commands.exits import Exit
from gpugate.config.paths import ConfigNotFound

COMMANDS: dict[str, Command] = {
    "check": check,
    "status": status,
    "serve": serve,
    "lease": lease,
    "admit": admit,
    "leases": views,
    "events": views,
    "envelopes": views,
    "evict": operator,
    "drain": operator,
    "undrain": operator,
    "pause": operator,
    "resume": operator,
    "init": init,
    "share": share,
    "sim": sim,
    "demo": demo,
}
"""Every `gpugate` command and the module that adds and runs it, in the order `gpugate
--help` lists them."""


class _Parser(argparse.ArgumentParser):
    """argparse's parser with EX_USAGE for a bad command line: argparse's own 2 means
    nothing to a caller that reads sysexits codes. Subcommands' parsers are this class too
    (add_subparsers takes the parent's class)."""

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(Exit.USAGE, f"{self.prog}: error: {message}\n")


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="gpugate",
        description="VRAM admission gate for GPU runtimes (Ollama, ComfyUI, whisper.cpp, ...).",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    # A module with several commands adds them all at once, where its first one stands.
    for module in dict.fromkeys(COMMANDS.values()):
        module.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run `gpugate` with `argv` (default: this process's); the exit code."""
    words = sys.argv[1:] if argv is None else list(argv)
    # `admit CONSUMER ... -- CMD ARGS`: what follows `--` is the command, whatever it holds
    # (argparse cannot put a positional after options and a second positional list).
    command: list[str] = []
    if words[:1] == ["admit"] and "--" in words:
        at = words.index("--")
        words, command = words[:at], words[at + 1 :]
    args = _parser().parse_args(words)
    if args.command == "admit":
        args.argv = command
    try:
        return int(COMMANDS[args.command].run(args))
    except ConfigNotFound as exc:
        print(f"gpugate {args.command}: {exc}", file=sys.stderr)
        return Exit.CONFIG


if __name__ == "__main__":
    sys.exit(main())
