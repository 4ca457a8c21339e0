"""Running the listeners: the consumer listeners' runner (server.py, connections.py), the
control API's runner whose aiohttp sites accept through a `Guard` (guard.py), the
open-files limit and the connection caps it can carry, and the loop's error handler.

What is here runs each listener as a whole: starting and stopping sites, giving in-flight
requests their grace at shutdown, fitting every listener's caps under the descriptors the
process may open, making room when an accept still fails for want of one, and keeping a
repeated loop error to a line per interval.
"""

from __future__ import annotations

import asyncio
import logging
import resource
import traceback
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from aiohttp import web

from gpugate.config.model import ListenerLimits
from gpugate.logs import OncePerInterval
from gpugate.proxy.connections import OUT_OF_FILES, ListenerServer, out_of_files
from gpugate.proxy.dialects.base import HttpDialect
from gpugate.proxy.guard import SHUTDOWN_MARGIN, Guard
from gpugate.proxy.server import Handler


class _Guarded(web.BaseRunner):
    """A runner whose sites accept through a `Guard`, and whose shutdown is `drain`.

    aiohttp's own shutdown applies its timeout twice to a handler that streams: it waits
    that long for the handler, then fails the request's payload (which a handler writing a
    response never reads) and waits as long again, each wait rounded up to whole seconds
    above 5 s. So the grace period is kept here, and aiohttp's timeout is only a margin.
    """

    limits: ListenerLimits
    name: str
    max_connections: int
    guard: Guard | None

    def _guard(self, server: web.Server) -> web.Server:
        self.guard = Guard(server, self.limits, self.name, self.max_connections)
        return server

    @property
    def server(self) -> web.Server | None:  # the sites' protocol factory
        return self.guard  # type: ignore[return-value]

    async def stop_accepting(self) -> None:
        """Close the listening sockets; open connections stay."""
        for site in list(self.sites):
            await site.stop()

    async def drain(self, grace: float) -> int:
        """In-flight requests get `grace` seconds, then are cancelled; returns how many were."""
        return 0 if self.guard is None else await self.guard.drain(grace)


def _server_settings(limits: ListenerLimits) -> dict[str, Any]:
    return {
        "handler_cancellation": True,
        "access_log": None,
        "keepalive_timeout": limits.idle_timeout,
        # A proxy forwards a request body as the client encoded it.
        "auto_decompress": False,
    }


class GuardedRunner(_Guarded, web.AppRunner):
    """A guarded runner for an application (the control API)."""

    async def start(self, host: str | None, port: int) -> None:
        """Set up and listen on `host`:`port` (every address when None)."""
        await self.setup()
        site = web.TCPSite(self, host, port, reuse_address=True)
        try:
            await site.start()
        except OSError:
            await self.cleanup()
            raise

    def __init__(
        self, app: web.Application, limits: ListenerLimits, name: str, max_connections: int
    ) -> None:
        super().__init__(app, shutdown_timeout=SHUTDOWN_MARGIN, **_server_settings(limits))
        self.limits = limits
        self.name = name
        self.max_connections = max_connections
        self.guard = None

    async def _make_server(self) -> web.Server:
        return self._guard(await super()._make_server())


class ListenerRunner:
    """A consumer listener's socket and connections (server.py, connections.py), started,
    drained and stopped as the control API's runner is; `on_cleanup` runs once its socket
    and connections are closed."""

    def __init__(
        self,
        handler: Handler,
        dialect: HttpDialect,
        on_cleanup: Callable[[], Awaitable[None]],
        limits: ListenerLimits,
        name: str,
        max_connections: int,
    ) -> None:
        self.server = ListenerServer(handler, dialect, limits, name, max_connections)
        self._on_cleanup = on_cleanup
        self._site: asyncio.Server | None = None

    async def start(self, host: str | None, port: int) -> None:
        """Listen on `host`:`port` (every address when None)."""
        loop = asyncio.get_running_loop()
        try:
            self._site = await loop.create_server(
                self.server, host, port, reuse_address=True, backlog=BACKLOG
            )
        except OSError:
            await self.cleanup()
            raise

    @property
    def addresses(self) -> list[Any]:
        site = self._site
        return [] if site is None else [s.getsockname() for s in site.sockets]

    async def stop_accepting(self) -> None:
        """Close the listening socket; open connections stay."""
        if self._site is not None:
            self._site.close()

    async def drain(self, grace: float) -> int:
        """Waiting connections close; requests in flight get `grace` seconds, then are
        cancelled; returns how many were."""
        return await self.server.drain(grace)

    async def cleanup(self) -> None:
        await self.stop_accepting()
        self.server.close_all()
        self._site = None
        await self._on_cleanup()


BACKLOG = 1024
"""Connections the kernel queues for the listener before it accepts them: a burst of new
connections waits there while idle ones give way."""


FD_RESERVE = 64
"""Descriptors kept for everything but client connections: the database, NVML, logs, the
gate's own calls to runtimes, and the connections accepted at once before a refusal."""
FD_PER_LISTENER = 16
"""Per listener: its socket, and refusals in flight."""


def raise_fd_limit() -> tuple[int, int]:
    """Raise the soft RLIMIT_NOFILE to the hard limit; returns (before, after)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft >= hard:
        return soft, soft
    target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (ValueError, OSError):
        return soft, soft
    return soft, target


def fit_caps(wanted: Sequence[tuple[int, int]], fd_limit: int) -> list[int]:
    """Connection caps the fd limit can carry: `wanted` is (cap, fds per connection) each.

    Caps that fit are kept; otherwise all are scaled down by the same factor (at least 1
    each), so a flood of connections is refused with a 503 instead of failing accept().
    """
    available = max(fd_limit - FD_RESERVE - FD_PER_LISTENER * len(wanted), len(wanted))
    needed = sum(cap * cost for cap, cost in wanted)
    if needed <= available:
        return [cap for cap, _ in wanted]
    factor = available / needed
    return [max(1, int(cap * factor)) for cap, _ in wanted]


loop_errors = OncePerInterval(logging.getLogger("gpugate.loop"), 30.0)


def quiet_loop_errors(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    """Loop exception handler: a repeated error is one line per interval with a count.

    asyncio reports a failed accept() ("socket.accept() out of system resource") on every
    attempt while descriptors run out; a traceback each time would flood the log.
    """
    message = str(context.get("message") or "error in the event loop")
    exc = context.get("exception")
    if isinstance(exc, OSError) and exc.errno in OUT_OF_FILES:
        # asyncio pauses the listener's accepts for a second and tries again: the
        # connections waiting longest are closed so that the retry finds descriptors.
        out_of_files()
    if isinstance(exc, OSError):
        key = f"{message}|{exc.errno}"
        loop_errors.error(key, "%s: %s", message, exc)
    elif isinstance(exc, BaseException):
        key = f"{message}|{type(exc).__name__}|{exc}"
        text = "".join(traceback.format_exception(exc)).rstrip()
        loop_errors.error(key, "%s\n%s", message, text)
    else:
        loop_errors.error(message, "%s", message)
