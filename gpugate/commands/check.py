"""`gpugate check [FILE]`: validate a consumers.yaml and say what it configures; the
checking is the configuration's own (gpugate.config.check)."""

from __future__ import annotations

import argparse
from pathlib import Path

from gpugate.config.paths import find_config


def add_parser(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """The `check` subcommand's argument."""
    check = subparsers.add_parser("check", help="validate a consumers.yaml")
    check.add_argument(
        "file", nargs="?", type=Path,
        help="default: $GPUGATE_CONFIG, ./consumers.yaml, /etc/gpugate/consumers.yaml",
    )  # fmt: skip


def run(args: argparse.Namespace) -> int:
    """Check the file given, else the one every command finds when given none."""
    from gpugate.config.check import run_check
    from gpugate.runtimes.sections import RUNTIME_TABLE

    return run_check(find_config(args.file, given_as=None), runtimes=RUNTIME_TABLE)
