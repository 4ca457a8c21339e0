"""How a simulated server's process serves until it is told to stop: the one entry the
servers' `__main__` modules share (Ollama, ComfyUI, vLLM, whisper-server, llama-server;
the two that serve a part of HOST.yaml in this process start through hostpart.py).

A launcher's blocked stop signals are inherited across exec (the reader threads of a
simulated host block them, children.py), so a server takes SIGTERM and SIGINT back before
anything else. The first one stops it: it closes and exits 0. Where the real server exits
at once on a second one (whisper-server, llama-server), the server's `second` does so.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

from aiohttp import web

from gpugate_sim.device import SimulatedGpuHost
from gpugate_sim.holder import pose_as
from gpugate_sim.shim import STATE_ENV

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
EXIT_USAGE = 2
"""A host file, a part of it or a simulated GPU that is not there (argparse's own code)."""


def take_back_stop_signals() -> None:
    """Unblock SIGTERM and SIGINT, which a launcher may have blocked and exec passed on."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, set(STOP_SIGNALS))


async def serve_until_signal(
    start: Callable[[], Awaitable[int | None]],
    close: Callable[[], Awaitable[None]],
    *,
    stop: asyncio.Event | None = None,
    first: Callable[[int], None] | None = None,
    second: Callable[[int], None] | None = None,
) -> int:
    """Start a server, serve until SIGTERM or SIGINT (or until `stop` is set), close it; the
    exit code.

    `start` returns None once the server serves, or the exit code when it could not start:
    it has then said why, in the real server's words, and cleaned up after itself. `first`
    runs at the first stop signal, `second` at each one after it.
    """
    stopped = stop if stop is not None else asyncio.Event()

    def on_signal(signum: int) -> None:
        if not stopped.is_set():
            stopped.set()
            if first is not None:
                first(signum)
        elif second is not None:
            second(signum)

    take_back_stop_signals()
    loop = asyncio.get_running_loop()
    for signum in STOP_SIGNALS:
        loop.add_signal_handler(signum, on_signal, signum)
    code = await start()
    if code is not None:
        return code
    try:
        await stopped.wait()
    finally:
        await close()
    return 0


class AppSite:
    """An aiohttp application (or a runner of aiohttp's low-level server) served on
    HOST:PORT, as `serve_until_signal` starts and closes it: `start` answers a port it
    cannot bind with `bind_failed`'s exit code (which says so in the real server's words)
    and calls `listening` once it listens (what the real server prints then)."""

    def __init__(
        self,
        app: web.Application | web.BaseRunner,
        host: str,
        port: int,
        *,
        bind_failed: Callable[[OSError], int],
        listening: Callable[[], None] | None = None,
        reuse_address: bool = True,
        reuse_port: bool = False,
        **runner_options: Any,
    ) -> None:
        self.runner: web.BaseRunner = (
            app
            if isinstance(app, web.BaseRunner)
            else web.AppRunner(app, handle_signals=False, access_log=None, **runner_options)
        )
        self.host, self.port = host, port
        self.bind_failed, self.listening = bind_failed, listening
        self.reuse_address, self.reuse_port = reuse_address, reuse_port

    async def start(self) -> int | None:
        await self.runner.setup()
        site = web.TCPSite(
            self.runner,
            self.host,
            self.port,
            reuse_address=self.reuse_address,
            reuse_port=self.reuse_port,
        )
        try:
            await site.start()
        except OSError as exc:
            await self.runner.cleanup()
            return self.bind_failed(exc)
        if self.listening is not None:
            self.listening()
        return None

    async def close(self) -> None:
        await self.runner.cleanup()

    def bound(self) -> tuple[str, int]:
        """The address it listens on (the port the kernel chose for port 0)."""
        for address in self.runner.addresses:
            return str(address[0]), int(address[1])
        return self.host, self.port


NO_HOST = f"error: no simulated GPU host (--sim-state-dir or ${STATE_ENV})"


def state_dir_of(given: Path | None) -> Path | None:
    """The simulated GPU host's directory: `given` (`--sim-state-dir`), else the directory of
    the state file the fake NVML library is pointed at."""
    if given is None and os.environ.get(STATE_ENV):
        return Path(os.environ[STATE_ENV]).parent
    return given


def begin(
    parser: argparse.ArgumentParser,
    program: str,
    argv: Sequence[str] | None,
    *,
    unknown: Callable[[str], int] | None = None,
) -> tuple[argparse.Namespace, SimulatedGpuHost]:
    """Begin the process of a simulated server that runs as `program` on a simulated GPU
    host: its options (`argv`, else the command line's) and its host, found through
    `--sim-state-dir` (SystemExit 2 when there is none); the stop signals taken back and the
    process shown as `program` with its real options (holder.pose_as).

    A server whose real parser meets an unknown word otherwise than argparse does gives
    `unknown`: it is called with the first such word, says what the real one says, and its
    return is the exit code."""
    words = list(sys.argv[1:] if argv is None else argv)
    if unknown is None:
        args = parser.parse_args(words)
    else:
        args, rest = parser.parse_known_args(words)
        if rest:
            raise SystemExit(unknown(rest[0]))
    state_dir = state_dir_of(args.sim_state_dir)
    if state_dir is None or not SimulatedGpuHost(state_dir).state_path.exists():
        print(NO_HOST, file=sys.stderr)
        raise SystemExit(EXIT_USAGE)
    take_back_stop_signals()
    pose_as(program, words)
    return args, SimulatedGpuHost(state_dir)
