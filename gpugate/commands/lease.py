"""`gpugate lease`: run a command under an explicit VRAM lease from the running gate.

    gpugate lease --consumer X --bytes 4GiB [--class C] [--ttl 30s] [--wait 2m] -- CMD ARGS

The lease is asked for first (waiting up to --wait); CMD runs once it is granted, with
GPUGATE_LEASE set to its id. The lease is renewed every ttl/3 and released when CMD exits;
SIGINT, SIGTERM and SIGHUP are passed on to CMD. Once CMD ran, the exit status is CMD's
(128 + the signal when a signal ended it; 126 or 127 when it could not be run). Without a
lease CMD does not run, and the status says why (exits.py, one line on stderr, the
failure class first): 75 only when no room came within the wait, so a retry can succeed;
64 for a command line that does not parse, 65 for a lease the gate refuses as asked, 69
when no gate answers, 77 for a token it refuses, 78 without a configuration.

CMD cannot outlive this command. Killed without a chance to pass anything on (SIGKILL, the
OOM killer), it takes CMD with it (`dies_with`), and the lease lapses by itself after its
ttl; no process goes on using memory whose lease has lapsed. Only CMD is tied: a process
CMD starts and leaves behind (a shell's background job, a daemon) is CMD's to end.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path

import aiohttp

from gpugate.commands.control_client import (
    ControlFailure,
    ask_lease,
    control_address,
    control_session,
)
from gpugate.commands.exits import Exit
from gpugate.config.paths import find_config
from gpugate.core.classes import PriorityClass
from gpugate.core.units import parse_duration, parse_size

FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def add_parser(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """The `lease` subcommand's arguments."""
    lease = subparsers.add_parser(
        "lease",
        help="run a command under an explicit VRAM lease",
        usage="gpugate lease (--consumer NAME | --identity NAME) --bytes SIZE [--class C] "
        "[--ttl 30s] [--wait 2m] [--gpu N] -- CMD [ARGS...]",
    )
    owner = lease.add_mutually_exclusive_group(required=True)
    owner.add_argument("--consumer", help="a configured consumer the bytes are counted for")
    owner.add_argument("--identity", help="a configured identity (its own budget row)")
    lease.add_argument("--bytes", required=True, help="how much VRAM, e.g. 4GiB")
    lease.add_argument("--class", dest="priority", help="priority class (default: the owner's)")
    lease.add_argument("--ttl", default="30s", help="renewal deadline (default 30s)")
    lease.add_argument("--wait", help="the longest to wait for the lease (default: the class's)")
    lease.add_argument("--gpu", type=int, help="NVML index, for an identity (default: the first)")
    lease.add_argument("--config", type=Path, help="consumers.yaml (the control address, token)")
    lease.add_argument("argv", nargs=argparse.REMAINDER, metavar="CMD", help="-- CMD [ARGS...]")


def _fail(message: str, code: Exit) -> int:
    print(f"gpugate lease: {message}", file=sys.stderr, flush=True)
    return code


def _duration(option: str, value: str) -> float:
    try:
        return parse_duration(value)
    except ValueError as exc:
        raise ValueError(f"{option}: {exc}") from None


def _terms(args: argparse.Namespace) -> dict[str, object]:
    """The lease request from the options; ValueError naming the option that does not parse.

    Checked here rather than left to the gate: a value that cannot parse is the command
    line's fault (EX_USAGE), whatever the gate would call it."""
    try:
        nbytes = parse_size(args.bytes)
    except ValueError as exc:
        raise ValueError(f"--bytes: {exc}") from None
    if nbytes <= 0:
        raise ValueError(f"--bytes: a lease must be for more than 0 bytes, got {args.bytes!r}")
    ttl = _duration("--ttl", args.ttl)
    if ttl < 1:
        raise ValueError("--ttl: at least 1s, so that a renewal can arrive in time")
    body: dict[str, object] = {"bytes": nbytes, "ttl": ttl}
    if args.wait is not None:
        body["max_wait"] = _duration("--wait", args.wait)
    if args.priority is not None:
        try:
            body["class"] = PriorityClass.parse(args.priority).label
        except ValueError as exc:
            raise ValueError(f"--class: {exc}") from None
    if args.consumer is not None:
        body["consumer"] = args.consumer
    else:
        body["identity"] = args.identity
    if args.gpu is not None:
        body["gpu"] = args.gpu
    return body


def run(args: argparse.Namespace) -> int:
    """The `gpugate lease` command: the command line checked, then the configuration found."""
    command = list(args.argv)
    if command[:1] == ["--"]:
        command = command[1:]
    if not command:
        return _fail("give the command to run after --", Exit.USAGE)
    try:
        body = _terms(args)
    except ValueError as exc:
        return _fail(str(exc), Exit.USAGE)
    config_path = find_config(args.config)
    from gpugate.config.loader import ConfigError

    try:
        url, token = control_address(config_path)
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return Exit.CONFIG
    return asyncio.run(_lease_and_run(url, token, body, command))


class _Signals:
    """Stop signals, from before the lease is asked for: passed on to CMD once it runs,
    and before that remembered, so a signal in between still ends the command's run."""

    def __init__(self) -> None:
        self.process: asyncio.subprocess.Process | None = None
        self.early: int | None = None

    def __enter__(self) -> _Signals:
        loop = asyncio.get_running_loop()
        for signum in FORWARDED:
            loop.add_signal_handler(signum, self._on_signal, signum)
        return self

    def __exit__(self, *exc: object) -> None:
        loop = asyncio.get_running_loop()
        for signum in FORWARDED:
            loop.remove_signal_handler(signum)

    def _on_signal(self, signum: int) -> None:
        if self.process is None:
            self.early = self.early or signum
            return
        with contextlib.suppress(ProcessLookupError):
            self.process.send_signal(signum)


async def _lease_and_run(url: str, token: str | None, body: dict, command: list[str]) -> int:
    with _Signals() as signals:
        async with control_session(url, token) as session:
            try:
                answer = await ask_lease(session, url, body)
            except ControlFailure as exc:
                return _fail(str(exc), exc.code)
            lease_id = answer["id"]
            try:
                if signals.early is not None:
                    return 128 + signals.early
                return await _run_under(session, lease_id, float(answer["ttl"]), command, signals)
            finally:
                with contextlib.suppress(aiohttp.ClientError, OSError, TimeoutError):
                    async with session.delete(f"/gate/v1/leases/{lease_id}") as resp:
                        await resp.read()


async def _run_under(
    session: aiohttp.ClientSession,
    lease_id: int,
    ttl: float,
    command: list[str],
    signals: _Signals,
) -> int:
    env = dict(os.environ, GPUGATE_LEASE=str(lease_id))
    try:
        process = await asyncio.create_subprocess_exec(
            *command, env=env, preexec_fn=dies_with(os.getpid())
        )
    except OSError as exc:
        print(f"gpugate lease: cannot run {command[0]}: {exc.strerror}", file=sys.stderr)
        return 127 if isinstance(exc, FileNotFoundError) else 126
    signals.process = process
    if signals.early is not None:
        # A signal came while the command was being started: it is the command's now.
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(signals.early)
    renewer = asyncio.create_task(_renew(session, lease_id, ttl))
    try:
        code = await process.wait()
    finally:
        renewer.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await renewer
    return 128 - code if code < 0 else code


PR_SET_PDEATHSIG = 1
"""prctl(2): the signal the calling process gets when the thread that forked it ends."""
_libc = ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None


def dies_with(parent: int) -> Callable[[], None] | None:
    """What CMD's child runs before its exec on Linux: SIGKILL once `parent` (this command)
    is gone, however it went (prctl(2) PR_SET_PDEATHSIG; kept across execve, but cleared
    by the exec of a set-user-ID or set-group-ID program, or one with file capabilities). A
    parent that died before the prctl took effect is caught by looking again: the child
    was re-parented by then, and kills itself.

    The death signal follows the thread that forked the child: asyncio.run's loop forks in
    this command's main thread, which lives as long as the command does.
    """
    libc = _libc
    if libc is None:
        return None
    kill = int(signal.SIGKILL)

    def child() -> None:
        # Between fork and exec: no imports, no locks, nothing but these two calls.
        if libc.prctl(PR_SET_PDEATHSIG, kill, 0, 0, 0) != 0:
            os.write(2, b"gpugate lease: prctl(PR_SET_PDEATHSIG) failed; not running CMD\n")
            os._exit(126)
        if os.getppid() != parent:
            os.kill(os.getpid(), kill)

    return child


async def _renew(session: aiohttp.ClientSession, lease_id: int, ttl: float) -> None:
    """Renew every ttl/3; one lost renewal still leaves two more before the lease lapses.
    Each renewal's answer says the ttl from then on (shorter when `gate.max_lease_ttl` was
    lowered since the grant)."""
    while True:
        await asyncio.sleep(ttl / 3)
        try:
            async with session.post(
                f"/gate/v1/leases/{lease_id}/renew", timeout=aiohttp.ClientTimeout(total=ttl / 3)
            ) as resp:
                if resp.status == 409:
                    print(
                        f"gpugate lease: lease {lease_id} lapsed; the command runs on without it",
                        file=sys.stderr,
                        flush=True,
                    )
                    return
                if resp.status == 200:
                    ttl = _renewed_ttl(await resp.json(content_type=None), ttl)
        except (aiohttp.ClientError, OSError, TimeoutError, ValueError) as exc:
            print(f"gpugate lease: renewal failed: {exc}", file=sys.stderr, flush=True)


def _renewed_ttl(answer: object, ttl: float) -> float:
    """The ttl a renewal's answer gives the lease (`ttl` unchanged when it says none)."""
    given = answer.get("ttl") if isinstance(answer, dict) else None
    if isinstance(given, int | float) and not isinstance(given, bool) and given >= 1:
        return float(given)
    return ttl
