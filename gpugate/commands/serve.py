"""`gpugate serve [--config FILE]`: run the gate. The process itself (its listeners, its
gate, its signals) is gpugate.serve's, imported only when the command runs."""

from __future__ import annotations

import argparse
from pathlib import Path

from gpugate.config.paths import find_config


def add_parser(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """The `serve` subcommand's option."""
    serve = subparsers.add_parser("serve", help="run the gate")
    serve.add_argument(
        "--config", type=Path,
        help="consumers.yaml (default: $GPUGATE_CONFIG, ./consumers.yaml, "
        "/etc/gpugate/consumers.yaml)",
    )  # fmt: skip


def run(args: argparse.Namespace) -> int:
    """Serve until SIGINT or SIGTERM."""
    from gpugate.serve import run_serve

    return run_serve(find_config(args.config))
