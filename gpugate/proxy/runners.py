"""Running a listener behind its guard: the runners whose sites accept through a `Guard`,
the open-files limit and the connection caps it can carry, and the loop's error handler.

A listener's connections are guarded one by one in guard.py; what is here runs them as a
whole: starting and stopping sites, giving in-flight requests their grace at shutdown,
fitting every listener's caps under the descriptors the process may open, and keeping a
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
from gpugate.proxy.guard import SHUTDOWN_MARGIN, Guard


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


class GuardedServerRunner(_Guarded, web.ServerRunner):
    """A guarded runner for one low-level handler (a consumer's listener); `on_cleanup`
    runs once its sites and connections are closed."""

    def __init__(
        self,
        make_server: Callable[..., web.Server],
        on_cleanup: Callable[[], Awaitable[None]],
        limits: ListenerLimits,
        name: str,
        max_connections: int,
    ) -> None:
        super().__init__(make_server(**_server_settings(limits)), shutdown_timeout=SHUTDOWN_MARGIN)
        self.limits = limits
        self.name = name
        self.max_connections = max_connections
        self.guard = None
        self._on_cleanup = on_cleanup

    async def _make_server(self) -> web.Server:
        return self._guard(await super()._make_server())

    async def _cleanup_server(self) -> None:
        await self._on_cleanup()


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
    if isinstance(exc, OSError):
        key = f"{message}|{exc.errno}"
        loop_errors.error(key, "%s: %s", message, exc)
    elif isinstance(exc, BaseException):
        key = f"{message}|{type(exc).__name__}|{exc}"
        text = "".join(traceback.format_exception(exc)).rstrip()
        loop_errors.error(key, "%s\n%s", message, text)
    else:
        loop_errors.error(message, "%s", message)
