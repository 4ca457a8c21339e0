"""The consumer listeners' own HTTP/1 server: one asyncio protocol per client connection.

The bytes are the server's; their reading is the runtime's server's (`HttpDialect`,
proxy/dialects): the dialect reads each request head and writes the answers that server
writes by itself, and the connection here frames the body by what the head says,
sends `100 Continue` when the dialect would, and serves pipelined requests strictly in
order: after a complete request the bytes that follow are the next request's head, read
only once the answer before them was written (so junk after a served request gets its
refusal after that answer, as a server that reads one request at a time gives it), except
where the dialect's server drops what it read past a request's end (cpp-httplib:
`_read_ahead`).

A request is handed to the listener's handler as soon as its head is read, its body
still arriving (request.py's `Body`): a handler that needs the body reads it whole, one
that relays it upstream streams it, so a runtime that answers before a body's end (an
early 404, a GET answered at once) is relayed as it answers. One task per connection
serves its requests one after another; the answer is written with `transport.write`.

A connection is kept open after an answer only when the dialect's reading of the
request keeps it (`RequestHead.keep_alive`), the handler did not end it (an upstream's
own `Connection: close`), and the request's body was read to its end. Heads are read and
bodies framed in server_reading.py (a part of `Connection`); timers, caps and making room
for new connections are connections.py's.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Protocol

from gpugate.proxy.dialects.base import ChunkReader, HttpDialect
from gpugate.proxy.request import BodyBroken, Request, http_date
from gpugate.proxy.server_reading import PIPELINE_BUFFER, Phase, RequestReading, keeps_after

log = logging.getLogger("gpugate.listener")

LINGER = 2.0
"""Seconds a connection closed with its client's bytes unread reads and drops them first."""
RESCAN = 4096
"""Bytes of an unfinished head without a line feed after which the dialect reads it again."""
INTERNAL_ERROR = (
    b"HTTP/1.1 500 Internal Server Error\r\nContent-Type: text/plain; charset=utf-8\r\n"
    b"Connection: close\r\n\r\n500 Internal Server Error"
)
"""What a connection gets when the listener itself failed on its request (Go's shape)."""


Handler = Callable[[Request], Awaitable[None]]


class Connections(Protocol):
    """What a connection tells its listener's connections (connections.py's `ListenerServer`)."""

    handler: Handler
    dialect: HttpDialect
    name: str

    def connected(self, conn: Connection) -> None: ...
    def disconnected(self, conn: Connection) -> None: ...
    def busy(self, conn: Connection) -> None: ...
    def receiving(self, conn: Connection) -> None: ...
    def handling(self, conn: Connection) -> None: ...
    def idle(self, conn: Connection) -> None: ...
    def lingering(self, conn: Connection, seconds: float) -> None: ...
    def watch_sending(self, conn: Connection) -> None: ...
    def stop_watching_sending(self, conn: Connection) -> None: ...


class Connection(RequestReading, asyncio.Protocol):
    """One client connection: its bytes, its requests in order, its answers (its heads read
    and its bodies framed by `RequestReading`, server_reading.py)."""

    def __init__(self, server: Connections) -> None:
        self.server = server
        self.transport: asyncio.Transport | None = None
        self.client = ""
        self.phase = Phase.HEADERS
        self.refused = False
        self.upgraded: Callable[[bytes], None] | None = None
        """Where the bytes go once the connection switched protocols (a websocket)."""
        self.on_eof: Callable[[], None] | None = None
        self._buffer = b""
        self._rescan = 0
        self._request: Request | None = None
        self._left = 0
        """Body bytes still to come for a Content-Length body; -1 for one read to the close."""
        self._requests = 0
        self._refusals = 0
        """Requests refused by the dialect's reading, which no handler saw."""
        self._last_method = ""
        """The method of the request answered last on this connection (Go's
        `skip_before_head` drops a POST's stray line ends)."""
        self._chunks: ChunkReader | None = None
        self._unused = b""
        self._task: asyncio.Task[None] | None = None
        self._next: asyncio.Future[Request | None] | None = None
        self._paused_reading = False
        self._body_paused = False
        self.writing_paused = False
        self._drain_waiters: list[asyncio.Future[None]] = []
        # Timers, kept by connections.py: one for the phase, one while writing is paused.
        self.timer: asyncio.TimerHandle | None = None
        self.timer_at = 0.0
        self.deadline: float | None = None
        self.send_timer: asyncio.TimerHandle | None = None
        self.unsent = 0
        self.lingering = False

    # -- asyncio.Protocol ------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        peer = transport.get_extra_info("peername")
        self.client = str(peer[0]) if isinstance(peer, tuple) and peer else ""
        self.server.connected(self)

    def data_received(self, data: bytes) -> None:
        if self.upgraded is not None:
            self.upgraded(data)
            return
        if self.refused:
            return
        if self.phase is Phase.BODY:
            self._feed_body(data)
            return
        self._buffer = self._buffer + data if self._buffer else data
        if self.phase is Phase.HANDLING:
            if len(self._buffer) > PIPELINE_BUFFER:
                self._pause_reading()
            return
        if self.phase is Phase.IDLE:
            self.phase = Phase.HEADERS
            self._read_head()
            if self.phase is Phase.HEADERS and not self.refused:
                self.server.busy(self)  # only part of a head came: its timer starts
            return
        # A head ends with a line feed: bytes without one are read again only every
        # RESCAN bytes (for the dialect's line limits), so a head sent a byte at a time
        # is not scanned whole for every byte.
        if b"\n" in data or len(self._buffer) >= self._rescan:
            self._rescan = len(self._buffer) + RESCAN
            self._read_head()

    def eof_received(self) -> bool | None:
        if self.on_eof is not None:
            self.on_eof()
            return None
        if self.phase in (Phase.HEADERS, Phase.IDLE) and self._buffer and not self.refused:
            refusal = self.server.dialect.on_eof_mid_head(
                self._buffer, http_date(), first=not self._requests
            )
            if refusal is not None and self.transport is not None:
                self.transport.write(refusal.data)
        request = self._request
        if (
            request is not None
            and self.phase is Phase.HANDLING
            and self.transport is not None
            and self.server.dialect.answers_after_client_end
            and (request.forwarded or not request.taken)
        ):
            # A runtime whose server reads nothing more while its handler runs
            # (cpp-httplib): a request sent whole, or already gone up, still gets its
            # answer, and the runtime is told of the end as it would have seen it. One the
            # gate holds (waiting for a lease or a start) has lost its client.
            request.client_ended()
            return True
        # A client that ends its side has gone, as aiohttp's and Go's servers take it: the
        # connection closes and a running handler is cancelled (its lease released, the
        # upstream request closed, so the runtime stops generating or aborts a load).
        return None

    def connection_lost(self, exc: BaseException | None) -> None:
        self.server.disconnected(self)
        request = self._request
        if request is not None:
            request.body.fail(ConnectionResetError("the client's connection was lost"))
        if self.on_eof is not None:
            self.on_eof()
        task = self._task
        if task is not None and not task.done():
            task.cancel()  # the handler's `finally` releases its lease
        nxt = self._next
        if nxt is not None and not nxt.done():
            nxt.set_result(None)
        for waiter in self._drain_waiters:
            if not waiter.done():
                waiter.set_exception(ConnectionResetError("the client's connection was lost"))
        self._drain_waiters.clear()
        self.transport = None

    def pause_writing(self) -> None:
        self.writing_paused = True
        self.server.watch_sending(self)

    def resume_writing(self) -> None:
        self.writing_paused = False
        self.server.stop_watching_sending(self)
        for waiter in self._drain_waiters:
            if not waiter.done():
                waiter.set_result(None)
        self._drain_waiters.clear()

    async def drain(self) -> None:
        """Wait until the transport's buffer went below its low-water mark."""
        if not self.writing_paused:
            return
        if self.transport is None:
            raise ConnectionResetError("the client's connection is closed")
        waiter = asyncio.get_running_loop().create_future()
        self._drain_waiters.append(waiter)
        await waiter

    @property
    def dialect(self) -> HttpDialect:
        return self.server.dialect

    # aiohttp's websocket reader and writer use these names (websocket.py)
    @property
    def _paused(self) -> bool:
        return self.writing_paused

    async def _drain_helper(self) -> None:
        await self.drain()

    @property
    def _reading_paused(self) -> bool:
        return self._paused_reading

    def pause_reading(self) -> None:
        self._pause_reading()

    def resume_reading(self) -> None:
        self._resume_reading()

    # -- flow control ----------------------------------------------------------------------

    def _pause_reading(self) -> None:
        if not self._paused_reading and self.transport is not None:
            self._paused_reading = True
            self.transport.pause_reading()

    def _resume_reading(self) -> None:
        if self._paused_reading and self.transport is not None:
            self._paused_reading = False
            self.transport.resume_reading()

    # -- serving ---------------------------------------------------------------------------

    async def _serve(self, request: Request | None) -> None:
        """Serve this connection's requests one after another."""
        server = self.server
        handler = server.handler
        while request is not None:
            request.taken = True
            try:
                refused = request.before_handler()
                if refused is not None:
                    request.send(refused)
                    await request.body.read(1 << 62)  # read and dropped, as aiohttp does
                else:
                    await handler(request)
            except BodyBroken as exc:
                # The chunked coding broke while the handler read the body: the server's
                # answer, unless the handler's had begun.
                if not request.started and self.transport is not None:
                    self.transport.write(exc.refusal.data)
                    if not keeps_after(self.server.dialect, exc.refusal):
                        request.cut()
                else:
                    request.cut()
            except (ConnectionError, asyncio.IncompleteReadError):
                request.cut()
            except Exception:
                log.exception("%s: the listener failed on a request", server.name)
                if self.transport is not None and not self.transport.is_closing():
                    self.transport.write(INTERNAL_ERROR)
                request.cut()
            request = self._after(request)
            if request is None and self.transport is not None and not self.refused:
                loop = asyncio.get_running_loop()
                self._next = loop.create_future()
                try:
                    request = await self._next
                finally:
                    self._next = None
        self._task = None

    def _after(self, request: Request) -> Request | None:
        """The answer went down: the next request, when its head is already here (else
        None: the connection waits for it, or closed)."""
        transport = self.transport
        self._request = None
        if transport is None or transport.is_closing():
            return None
        if not request.body.done:
            self.linger()
            return None
        if not request.keep_alive or self.refused or self.upgraded:
            transport.close()
            return None
        self.phase = Phase.IDLE
        self.server.idle(self)
        if self._paused_reading:
            self._resume_reading()
        if not self._buffer:
            return None
        self.server.busy(self)
        result = self._head()
        if result is None:
            if not self.refused:
                self.phase = Phase.HEADERS
            return None
        return self._start(result)

    def linger(self) -> None:
        """End a connection whose client may still be sending: the answer is followed by
        our end of the stream, what the client sends is read and dropped for LINGER
        seconds, then the connection closes. Closing at once with its bytes unread would
        reset it, and the client could lose the answer before reading it."""
        transport = self.transport
        self.refused = True
        self._buffer = b""
        if transport is None or transport.is_closing():
            return
        self._resume_reading()
        if not transport.can_write_eof():
            transport.close()
            return
        transport.write_eof()
        self.server.lingering(self, LINGER)

    def close(self) -> None:
        """Close the connection (its handler, if any, is cancelled when it is lost)."""
        if self.transport is not None:
            self.transport.close()

    def abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()

    @property
    def requests(self) -> int:
        """Requests read on this connection so far, the one being answered and the
        refused ones included."""
        return self._requests + self._refusals

    @property
    def task(self) -> asyncio.Task[None] | None:
        """The task serving this connection's requests, while one runs."""
        return self._task

    @property
    def handling(self) -> bool:
        return self.phase in (Phase.BODY, Phase.HANDLING) and self._task is not None
