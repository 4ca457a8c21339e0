"""The control listener's guards: no client connection can hold it for long or take all its
slots. (The consumer listeners run on the gate's own server, whose connections are guarded
in connections.py.)

aiohttp's RequestHandler bounds only the idle time between requests (`keepalive_timeout`).
Each connection is wrapped here in a `GuardedConnection` protocol that also bounds the time
to a request's complete headers and to the last byte of its body; the `Guard` (the sites'
protocol factory) refuses a connection over the listener's cap with a 503 and closes it.
The handler wrapper that marks "headers complete" also keeps the in-flight requests, so a
shutdown can give them exactly the grace period and then cancel them.

No client can starve the others: connections are capped per client address too, a full
listener makes room by closing the connection idle longest between requests before it
refuses one, and a client that takes none of an answer for `send_timeout` loses its
connection (its request's lease goes with the cancelled handler).
"""

from __future__ import annotations

import asyncio
import collections
import enum
import logging
from collections.abc import Awaitable, Callable

from aiohttp import hdrs, web
from aiohttp.http_exceptions import BadHttpMethod, HttpProcessingError
from aiohttp.web_protocol import RequestHandler

from gpugate.config.model import ListenerLimits
from gpugate.proxy.connections import REFUSAL, REFUSAL_LINGER, REFUSAL_LINGER_SLOTS
from gpugate.proxy.server_reading import limited

SHUTDOWN_MARGIN = 0.5
"""What aiohttp's own shutdown may take once the grace period is over and handlers are cancelled."""

Handler = Callable[[web.BaseRequest], Awaitable[web.StreamResponse]]


class Phase(enum.Enum):
    """Where a connection is in its current request, and so which timer runs."""

    HEADERS = "headers"
    BODY = "body"
    HANDLING = "handling"
    IDLE = "idle"


class GuardedConnection(asyncio.Protocol):
    """One client connection: aiohttp's RequestHandler, with header and body deadlines."""

    def __init__(self, guard: Guard, handler: RequestHandler) -> None:
        self.guard = guard
        self.handler = handler
        self.phase = Phase.HEADERS
        self.refused = False
        self.client = ""
        """The peer's address: connections are capped per address."""
        self._transport: asyncio.Transport | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = 0.0
        self._deadline: float | None = None
        self._send_timer: asyncio.TimerHandle | None = None
        self._unsent = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A stream transport (uvloop's are not subclasses of asyncio.Transport).
        self._transport = transport  # type: ignore[assignment]
        peer = transport.get_extra_info("peername")
        self.client = str(peer[0]) if isinstance(peer, tuple) and peer else ""
        if not self.guard.admit(self):
            self.refused = True
            self._refuse(transport)
            return
        self.guard.connected(self)
        self.handler.connection_made(transport)
        # A connection that never completes a request's headers is dropped like a slow one.
        self._arm(self.guard.limits.header_timeout, Phase.HEADERS)

    def data_received(self, data: bytes) -> None:
        if self.refused:
            return
        if self.phase is Phase.IDLE:
            self.guard.busy(self)
            self._arm(self.guard.limits.header_timeout, Phase.HEADERS)
        self.handler.data_received(data)

    def reclaim(self) -> None:
        """Close this idle keep-alive connection to make room for a new one (as nginx
        reuses its idle connections when it runs out): no request is lost, and a client
        sends its next request on a new connection."""
        self.guard.disconnected(self)
        self._cancel_timer()
        self.handler.force_close()

    def eof_received(self) -> bool | None:
        if self.refused:
            return None
        return self.handler.eof_received()

    def pause_writing(self) -> None:
        if not self.refused:
            self._watch_sending()
            self.handler.pause_writing()

    def resume_writing(self) -> None:
        if not self.refused:
            self._stop_watching_sending()
            self.handler.resume_writing()

    def connection_lost(self, exc: BaseException | None) -> None:
        self._cancel_timer()
        self._stop_watching_sending()
        if self.refused:
            self.guard.refusing = max(0, self.guard.refusing - 1)
            return
        self.guard.disconnected(self)
        self.handler.connection_lost(exc)

    # -- request phases, from the handler wrapper ------------------------------------------

    def headers_done(self, request: web.BaseRequest) -> None:
        """A request's headers arrived: its body now has body_timeout to arrive."""
        self.guard.busy(self)
        content = request.content
        if content.is_eof():
            self._disarm(Phase.HANDLING)
            return
        self._arm(self.guard.limits.body_timeout, Phase.BODY)
        content.on_eof(self._body_done)

    def _body_done(self) -> None:
        if self.phase is Phase.BODY:
            self._disarm(Phase.HANDLING)

    def request_done(self) -> None:
        """The handler returned; aiohttp's keep-alive timer bounds the wait for the next one."""
        self._disarm(Phase.IDLE)
        self.guard.idle(self)

    # -- sending ---------------------------------------------------------------------------
    # The transport pauses the writer when the client has not taken the last 64 KiB; while
    # paused, the bytes it still holds are looked at every send_timeout: a client that took
    # none of them since the last look loses its connection (and its request its lease).

    def _watch_sending(self) -> None:
        transport = self._transport
        if self._send_timer is not None or transport is None:
            return
        self._unsent = transport.get_write_buffer_size()
        self._send_timer = asyncio.get_running_loop().call_later(
            self.guard.limits.send_timeout, self._sending_check
        )

    def _stop_watching_sending(self) -> None:
        if self._send_timer is not None:
            self._send_timer.cancel()
            self._send_timer = None

    def _sending_check(self) -> None:
        self._send_timer = None
        transport = self._transport
        if transport is None or transport.is_closing():
            return
        unsent = transport.get_write_buffer_size()
        if unsent < self._unsent:
            self._watch_sending()  # it took some: look again later
            return
        limited.warning(
            f"{self.guard.name}:send",
            "%s: dropped a connection whose client took nothing for %gs",
            self.guard.name,
            self.guard.limits.send_timeout,
        )
        # close() would wait for the unsent bytes to go; abort() ends it now, and the
        # connection's loss cancels its handler (which releases the request's lease).
        transport.abort()

    # -- timers ----------------------------------------------------------------------------
    # One timer per connection, moved lazily: a phase sets its deadline, and the timer,
    # when it fires before the deadline, is set again for it. A request whose headers and
    # body come at once so creates no timer at all while an earlier one is still pending.

    def _arm(self, seconds: float, phase: Phase) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + seconds
        self.phase = phase
        self._deadline = deadline
        if self._timer is not None:
            if self._timer_at <= deadline:
                return
            self._timer.cancel()
        self._timer_at = deadline
        self._timer = loop.call_at(deadline, self._expire)

    def _disarm(self, phase: Phase) -> None:
        self.phase = phase
        self._deadline = None

    def _cancel_timer(self) -> None:
        self._deadline = None
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _expire(self) -> None:
        self._timer = None
        deadline = self._deadline
        if deadline is None:
            return
        loop = asyncio.get_running_loop()
        if loop.time() < deadline:
            self._timer_at = deadline
            self._timer = loop.call_at(deadline, self._expire)
            return
        phase = self.phase
        self._deadline = None
        limit = (
            self.guard.limits.header_timeout
            if phase is Phase.HEADERS
            else (self.guard.limits.body_timeout)
        )
        limited.warning(
            f"{self.guard.name}:{phase.value}",
            "%s: dropped a connection whose request %s took longer than %gs",
            self.guard.name,
            "headers" if phase is Phase.HEADERS else "body",
            limit,
        )
        # Closing the transport cancels a running handler (handler_cancellation), whose
        # `finally` releases any lease it holds.
        self.handler.force_close()

    # -- refusal ---------------------------------------------------------------------------

    def _refuse(self, transport: asyncio.Transport) -> None:
        guard = self.guard
        limited.warning(
            f"{guard.name}:refused",
            "%s: refused a connection over max_connections (%d)",
            guard.name,
            guard.max_connections,
        )
        transport.write(REFUSAL)
        guard.refusing += 1
        if guard.refusing <= REFUSAL_LINGER_SLOTS and transport.can_write_eof():
            transport.write_eof()
            self._timer = asyncio.get_running_loop().call_later(REFUSAL_LINGER, transport.close)
        else:
            transport.close()


class Guard:
    """Protocol factory for one listener's sites: counts, caps and times its connections."""

    def __init__(
        self, server: web.Server, limits: ListenerLimits, name: str, max_connections: int
    ) -> None:
        self.server = server
        self.limits = limits
        self.name = name
        self.max_connections = max_connections
        self.max_per_client = limits.per_client(max_connections)
        self.refusing = 0
        self.reclaimed = 0
        """Idle connections closed to make room for new ones, since start."""
        self._open: dict[RequestHandler, GuardedConnection] = {}
        self._idle: dict[GuardedConnection, None] = {}
        """Connections between requests, the longest idle first."""
        self._per_client: collections.Counter[str] = collections.Counter()
        self._inflight: set[asyncio.Task[object]] = set()
        self._inner: Handler = server.request_handler
        # Each RequestHandler copies this at creation, so it is replaced before any connects.
        server.request_handler = self._handle

    def __call__(self) -> GuardedConnection:
        handler = self.server()
        # Same slots, one method more: see _MethodTolerantHandler.
        handler.__class__ = _MethodTolerantHandler
        return GuardedConnection(self, handler)

    def full(self) -> bool:
        return len(self._open) >= self.max_connections

    def admit(self, connection: GuardedConnection) -> bool:
        """Whether a new connection may open: room is made by closing an idle connection
        (the client's own when it is at its cap, else the longest idle); False: refuse."""
        client = connection.client
        if self._per_client[client] >= self.max_per_client:
            return self._reclaim(client)
        if self.full():
            return self._reclaim(None)
        return True

    def _reclaim(self, client: str | None) -> bool:
        for idle in self._idle:
            if client is None or idle.client == client:
                idle.reclaim()
                self.reclaimed += 1
                return True
        return False

    def connected(self, connection: GuardedConnection) -> None:
        self._open[connection.handler] = connection
        self._per_client[connection.client] += 1

    def disconnected(self, connection: GuardedConnection) -> None:
        if self._open.pop(connection.handler, None) is not None:
            self._per_client[connection.client] -= 1
            if self._per_client[connection.client] <= 0:
                del self._per_client[connection.client]
        self._idle.pop(connection, None)

    def idle(self, connection: GuardedConnection) -> None:
        """The connection waits for its next request (reclaimable)."""
        if connection.handler in self._open:
            self._idle[connection] = None

    def busy(self, connection: GuardedConnection) -> None:
        """A new request began on the connection."""
        self._idle.pop(connection, None)

    @property
    def open_connections(self) -> int:
        return len(self._open)

    async def _handle(self, request: web.BaseRequest) -> web.StreamResponse:
        # aiohttp calls the handler once a request's headers are parsed.
        connection = self._open.get(request.protocol)
        if connection is not None:
            connection.headers_done(request)
        task = asyncio.current_task()
        assert task is not None
        self._inflight.add(task)
        try:
            return await self._inner(request)
        finally:
            self._inflight.discard(task)
            if connection is not None:
                connection.request_done()

    async def drain(self, grace: float) -> int:
        """Let in-flight requests run for up to `grace` seconds, then cancel the rest.

        Returns how many were cancelled.
        """
        running = set(self._inflight)
        if not running:
            return 0
        _, pending = await asyncio.wait(running, timeout=grace)
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.wait(pending, timeout=SHUTDOWN_MARGIN)
        return len(pending)


class _MethodTolerantHandler(RequestHandler):
    """aiohttp's RequestHandler, answering requests its parser refuses as Go's net/http does.

    The parser refuses a method it does not know, a malformed request line, header or URL
    before any handler runs, and aiohttp logs a traceback for each from a connection's
    second request on; a hostile client could fill the log. The runtimes behind are
    mostly Go servers, which route any method (here: a plain 405) and answer the rest with
    a plain "400 Bad Request". Either is logged once per interval with a count.
    """

    __slots__ = ()

    def handle_error(
        self,
        request: web.BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        if isinstance(exc, ConnectionError):
            # The client left while the gate was writing to it (aiohttp's own "100
            # Continue", say): nothing to answer and nothing wrong with the gate.
            limited.log(logging.DEBUG, "client-gone", "a client left mid-answer: %s", exc)
            response = _PlainResponse(status=status)
            response.force_close()
            return response
        if not isinstance(exc, HttpProcessingError):
            return super().handle_error(request, status, exc, message)
        if isinstance(exc, BadHttpMethod):
            status, body = 405, b"405 method not allowed"
        else:
            status, body = 400, b"400 Bad Request"
        limited.log(
            logging.INFO,
            f"malformed-{status}",
            "answered %d to a request the HTTP parser refused (%s), from %s",
            status,
            type(exc).__name__,
            request.remote,
        )
        response = _PlainResponse(status=status, body=body, content_type="text/plain")
        response.force_close()
        return response


class _PlainResponse(web.Response):
    """A response written by the listener itself, with no Server header of aiohttp's."""

    async def _prepare_headers(self) -> None:
        await super()._prepare_headers()
        self.headers.popall(hdrs.SERVER, None)
