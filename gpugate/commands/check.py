"""`gpugate check [FILE]`: validate a consumers.yaml and say what it configures; the
checking is the configuration's own (gpugate.config.check)."""

from __future__ import annotations

import argparse
from pathlib import Path

from gpugate.config.paths import default_config_path


def add_parser(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """The `check` subcommand's argument."""
    check = subparsers.add_parser("check", help="validate a consumers.yaml")
    check.add_argument(
        "file", nargs="?", type=Path, help="default: $GPUGATE_CONFIG or ./consumers.yaml"
    )


def run(args: argparse.Namespace) -> int:
    """Check the file given, else the one a command finds when given none."""
    from gpugate.config.check import run_check
    from gpugate.runtimes.sections import RUNTIME_TABLE

    return run_check(args.file or default_config_path(), runtimes=RUNTIME_TABLE)
