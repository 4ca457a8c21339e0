"""`gpugate admit`: admit a runtime's start against the VRAM budget, for a unit's ExecStartPre.

    gpugate admit CONSUMER [--wait DURATION] [--config FILE]

Asks the running gate for a start lease for CONSUMER's envelope (waiting up to --wait,
default: the consumer's class's max_wait) and exits 0 once it is granted; the process
started next then has its bytes. The lease needs no holder: the gate releases it once NVML
shows the consumer's processes holding the envelope, or after the consumer's
`control.start_admission_timeout` if they never do. When no lease can be had (or the gate
cannot be asked) it exits 75 (EX_TEMPFAIL) with the failure class on stderr in one line,
so systemd does not start the runtime into an allocation that cannot fit.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

from gpugate.control_client import (
    EX_TEMPFAIL,
    ControlFailure,
    ask_lease,
    control_address,
    control_session,
)
from gpugate.core.units import format_gib, parse_duration

EX_USAGE = 2


def add_admit_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """The `admit` subcommand's arguments."""
    admit = sub.add_parser(
        "admit",
        help="admit a runtime's start (a start lease for its envelope), for ExecStartPre",
        usage="gpugate admit CONSUMER [--wait DURATION] [--config FILE]",
    )
    admit.add_argument("consumer", metavar="CONSUMER", help="a configured consumer")
    admit.add_argument("--wait", help="the longest to wait for room (default: the class's)")
    admit.add_argument("--config", type=Path, help="consumers.yaml (the control address, token)")


def _say(message: str) -> None:
    print(f"gpugate admit: {message}", file=sys.stderr, flush=True)


def run_admit(args: argparse.Namespace, config_path: Path) -> int:
    """The `gpugate admit` command."""
    from gpugate.config.loader import ConfigError

    try:
        url, token = control_address(config_path)
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return EX_USAGE
    body: dict[str, object] = {"consumer": args.consumer, "purpose": "start"}
    if args.wait is not None:
        try:
            body["max_wait"] = parse_duration(args.wait)
        except ValueError as exc:
            _say(f"--wait: {exc}")
            return EX_USAGE
    return asyncio.run(_admit(url, token, body))


async def _admit(url: str, token: str | None, body: dict[str, object]) -> int:
    async with control_session(url, token) as session:
        try:
            lease = await ask_lease(session, url, body)
        except ControlFailure as exc:
            _say(str(exc))
            return EX_TEMPFAIL
    print(
        f"gpugate admit: {body['consumer']}: start lease {lease['id']} for "
        f"{format_gib(int(lease['bytes']))} on GPU {lease['gpu']} (waited {lease['waited']:g}s, "
        f"released once its process holds it, or in {lease['expires_in']:g}s)",
        flush=True,
    )
    return 0
