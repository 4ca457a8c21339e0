"""`gpugate sim run HOST.yaml`: start a simulated GPU host (what `gpugate demo` runs). The
simulator (gpugate.sim) is imported only when the command runs."""

from __future__ import annotations

import argparse
from pathlib import Path


def add_parser(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """The `sim` subcommand and its one subcommand, `run`."""
    sim = subparsers.add_parser("sim", help="the simulated GPU host")
    sim_sub = sim.add_subparsers(dest="sim_command", required=True)
    sim_run = sim_sub.add_parser("run", help="start a simulated host from HOST.yaml")
    sim_run.add_argument("host_file", type=Path)
    sim_run.add_argument(
        "--state-dir", type=Path, help="where the device state lives (default: a temporary one)"
    )


def run(args: argparse.Namespace) -> int:
    """Run the host until SIGTERM or SIGINT."""
    from gpugate.sim.host import run_host

    return run_host(args.host_file, state_dir=args.state_dir)
