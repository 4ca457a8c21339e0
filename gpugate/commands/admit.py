"""`gpugate admit`: admit a runtime's start against the VRAM budget, for a unit's ExecStartPre.

    gpugate admit CONSUMER [--wait DURATION] [--config FILE] [-- CMD [ARGS...]]

Asks the running gate for a start lease for CONSUMER's envelope (waiting up to --wait,
default: the consumer's class's max_wait) and exits 0 once it is granted; the process
started next then has its bytes. The lease needs no holder: the gate releases it once NVML
shows the consumer's processes holding the envelope, or after the consumer's
`control.start_admission_timeout` if they never do. Otherwise it exits non-zero with one
line on stderr, the failure class first, so systemd does not start the runtime into an
allocation that cannot fit; the code (exits.py) says whether trying again can help:
75 only when no room came within the wait; 65 for a consumer the gate does not know or
one with no envelope, 69 when no gate answers, 77 for a token it refuses, 64 and 78 for
the command line and the configuration.

With `-- CMD`, once the lease is granted `gpugate admit` becomes CMD (exec: the same
process, so a unit's main PID does not change) and CMD's status is the unit's. As the
unit's ExecStart it makes its refusals the main process's exit status, which
`RestartPreventExitStatus=` judges (it never judges ExecStartPre=): a wrong token (77)
stops the unit instead of restarting it forever, while no room (75) is retried.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from pathlib import Path

from gpugate.commands.control_client import (
    ControlFailure,
    ask_lease,
    control_address,
    control_session,
)
from gpugate.commands.exits import Exit
from gpugate.config.paths import find_config
from gpugate.core.units import format_gib, parse_duration


def add_parser(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """The `admit` subcommand's arguments."""
    admit = subparsers.add_parser(
        "admit",
        help="admit a runtime's start (a start lease for its envelope), for ExecStartPre",
        usage="gpugate admit CONSUMER [--wait DURATION] [--config FILE] [-- CMD [ARGS...]]",
    )
    admit.add_argument("consumer", metavar="CONSUMER", help="a configured consumer")
    admit.add_argument("--wait", help="the longest to wait for room (default: the class's)")
    admit.add_argument("--config", type=Path, help="consumers.yaml (the control address, token)")
    admit.set_defaults(argv=[])


def _say(message: str) -> None:
    print(f"gpugate admit: {message}", file=sys.stderr, flush=True)


def run(args: argparse.Namespace) -> int:
    """The `gpugate admit` command: the command line checked, then the configuration found."""
    from gpugate.config.loader import ConfigError

    argv = list(args.argv)
    body: dict[str, object] = {"consumer": args.consumer, "purpose": "start"}
    if args.wait is not None:
        try:
            body["max_wait"] = parse_duration(args.wait)
        except ValueError as exc:
            _say(f"--wait: {exc}")
            return Exit.USAGE
    config_path = find_config(args.config)
    try:
        url, token = control_address(config_path)
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return Exit.CONFIG
    code = asyncio.run(_admit(url, token, body))
    if code != Exit.OK or not argv:
        return code
    return _become(argv)


def _become(argv: list[str]) -> int:
    """Replace this process with `argv` (126/127 as a shell says, when it cannot run)."""
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execvp(argv[0], argv)
    except FileNotFoundError:
        _say(f"{argv[0]}: command not found")
        return 127
    except OSError as exc:
        _say(f"{argv[0]}: {exc.strerror or exc}")
        return 126
    return 126  # not reached: execvp returns only by raising


async def _admit(url: str, token: str | None, body: dict[str, object]) -> int:
    async with control_session(url, token) as session:
        try:
            lease = await ask_lease(session, url, body)
        except ControlFailure as exc:
            _say(str(exc))
            return exc.code
    print(
        f"gpugate admit: {body['consumer']}: start lease {lease['id']} for "
        f"{format_gib(int(lease['bytes']))} on GPU {lease['gpu']} (waited {lease['waited']:g}s, "
        f"released once its process holds it, or in {lease['expires_in']:g}s)",
        flush=True,
    )
    return Exit.OK
