"""Waiting for a started runtime to answer: its port first, then its health route.

whisper-server binds only once its model is loaded, then answers `GET /health` with 200
(503 while a /load runs). The polls start fast and slow down to `interval`, so a process
that answers in half a second is seen within a few milliseconds of it, and one that takes
a minute costs a poll every `interval`.
"""

from __future__ import annotations

import asyncio
import contextlib
from urllib.parse import urlsplit

import aiohttp

from gpugate.runtimes.process import Exit, NotReady, ProcessControl, ProcessExited

POLL_INTERVAL = 0.01
FIRST_POLL = 0.002


async def port_open(host: str, port: int) -> bool:
    """Whether something accepts connections on host:port."""
    try:
        _, writer = await asyncio.open_connection(host, port)
    except OSError:
        return False
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()
    return True


async def wait_ready(
    url: str,
    health_path: str | None = "/health",
    timeout: float = 60.0,
    *,
    process: ProcessControl | None = None,
    interval: float = POLL_INTERVAL,
) -> None:
    """Wait until `url`'s port accepts and `GET health_path` answers 200, within `timeout`
    (the port only, with no `health_path`).

    NotReady when time runs out; ProcessExited at once when `process` ends first (a
    start that aborted never counts as ready).
    """
    parts = urlsplit(url)
    host = parts.hostname or "127.0.0.1"
    port = parts.port or (443 if parts.scheme == "https" else 80)
    ended = process.ended() if process is not None else None
    stage = f"{host}:{port} to accept connections"
    last = ""
    pause = min(FIRST_POLL, interval)

    async def next_poll() -> None:
        nonlocal pause
        await _pause(ended, pause)
        pause = min(interval, pause * 2)

    def check_ended() -> None:
        if ended is not None and ended.done():
            raise ProcessExited(ended.result())

    try:
        async with asyncio.timeout(timeout):
            while True:
                check_ended()
                if await port_open(host, port):
                    break
                await next_poll()
            if health_path is None:
                return
            stage = f"GET {health_path} to answer 200"
            probe = aiohttp.ClientTimeout(total=max(interval, min(5.0, timeout)))
            async with aiohttp.ClientSession(timeout=probe) as session:
                while True:
                    check_ended()
                    try:
                        async with session.get(url.rstrip("/") + health_path) as resp:
                            await resp.read()
                            if resp.status == 200:
                                return
                            last = f" (last answer: {resp.status})"
                    except (aiohttp.ClientError, OSError, TimeoutError) as exc:
                        last = f" (last error: {exc!r})"
                    await next_poll()
    except TimeoutError:
        check_ended()
        raise NotReady(f"waited {timeout:g}s for {stage}{last}") from None


async def _pause(ended: asyncio.Future[Exit] | None, interval: float) -> None:
    """Sleep `interval`, waking early when the process ends."""
    if ended is None:
        await asyncio.sleep(interval)
        return
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(interval):
            await asyncio.shield(ended)
