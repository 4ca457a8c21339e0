"""The forwarding client's wire: one HTTP/1.1 connection to an upstream, nothing more.

A forwarded exchange is the gate's hottest path, and a general HTTP client does work a
proxy on loopback never needs: cookie jars, redirects, proxies, URL objects, per-request
timer objects, a response object and a stream reader per exchange. Here a request is one
`transport.write` of bytes the caller prepared, and the response is parsed by llhttp
(httptools, the parser of Node.js) as its bytes arrive, into a small buffer the caller
drains chunk by chunk. The connections are kept and handed out by pool.py.

Bounds: connecting is bounded on its own; after the request went up, one deadline per
connection covers the wait for the response headers, then the silence while the caller
waits for the next chunk. The deadline is a single timer that is moved lazily (when it
fires early it is set again for the current deadline), so a steady exchange creates no
timer objects at all.

A connection is reusable only after a complete response the upstream agreed to keep
alive; everything else (the caller gave up, the client went away, a HEAD answer whose
framing the parser cannot know) closes it, which is also how a runtime learns a
generation was abandoned.
"""

from __future__ import annotations

import asyncio
import collections
import enum
from collections.abc import AsyncIterable
from typing import Protocol

import httptools
from multidict import CIMultiDict

from gpugate.config.model import UpstreamTimeouts as Bounds

HIGH_WATER = 1 << 20
"""Bytes buffered from the upstream before reading from it pauses (the caller is slow)."""


class Stall(enum.Enum):
    """Where an upstream exchange ran out of time."""

    CONNECT = "connecting"
    SLOT = "waiting for a free connection to the upstream"
    FIRST_BYTE = "waiting for response headers"
    IDLE = "waiting for the next chunk of the response"


class UpstreamTimeout(Exception):
    """An upstream call passed one of its bounds."""

    def __init__(self, stall: Stall, seconds: float) -> None:
        super().__init__(f"no progress {stall.value} for {seconds:g}s")
        self.stall = stall
        self.seconds = seconds


class UpstreamClosed(ConnectionError):
    """The upstream closed the connection before its answer was complete."""


class UpstreamInvalid(ConnectionError):
    """The upstream's answer is not HTTP/1.1 the parser accepts."""


class Owner(Protocol):
    """What keeps a connection (pool.py): told when an exchange ends and when the
    connection is gone."""

    def give_back(self, connection: UpstreamConnection, reusable: bool) -> None:
        """The exchange on `connection` is over; keep it if `reusable`, else close it."""

    def forget(self, connection: UpstreamConnection) -> None:
        """`connection` is closed: it is no longer kept."""

    def slot_freed(self) -> None:
        """An exchange ended: its slot is free."""


class Response:
    """An upstream's answer: status and headers at once, the body as it arrives."""

    __slots__ = (
        "_buffered",
        "_chunks",
        "_connection",
        "_ended",
        "_error",
        "_waiter",
        "content_length",
        "raw_headers",
        "reason",
        "status",
    )

    def __init__(self, connection: UpstreamConnection) -> None:
        self._connection = connection
        self.status = 0
        self.reason = ""
        self.raw_headers: list[tuple[bytes, bytes]] = []
        self.content_length: int | None = None
        self._chunks: collections.deque[bytes] = collections.deque()
        self._buffered = 0
        self._ended = False
        self._error: BaseException | None = None
        self._waiter: asyncio.Future[None] | None = None

    def headers(self) -> CIMultiDict[str]:
        """The headers as a multidict (values decoded as aiohttp decodes them)."""
        return CIMultiDict(
            (name.decode("latin-1"), value.decode("utf-8", "surrogateescape"))
            for name, value in self.raw_headers
        )

    def header(self, name: bytes) -> bytes | None:
        """The last value of a header (`name` in lower case), or None."""
        found = None
        for key, value in self.raw_headers:
            if key.lower() == name:
                found = value
        return found

    @property
    def buffered(self) -> int:
        """Bytes of the body arrived and not yet taken."""
        return self._buffered

    @property
    def complete(self) -> bool:
        """The whole body arrived (it may still be buffered here)."""
        return self._ended

    async def chunk(self, idle: float) -> bytes:
        """What arrived of the body since the last call (b"" at its end), waiting at most
        `idle` seconds for something to arrive."""
        if not self._chunks:
            if self._ended:
                return b""
            if self._error is not None:
                raise self._error
            self._waiter = asyncio.get_running_loop().create_future()
            self._connection.arm(idle, Stall.IDLE)
            try:
                await self._waiter
            finally:
                self._waiter = None
            if not self._chunks:
                if self._error is not None:
                    raise self._error
                return b""
        chunks = self._chunks
        data = chunks.popleft() if len(chunks) == 1 else b"".join(chunks)
        chunks.clear()
        self._buffered = 0
        self._connection.resume()
        return data

    async def read(self, limit: int, idle: float) -> bytes:
        """Up to `limit` bytes of the body (all of it when shorter), each part within `idle`."""
        parts: list[bytes] = []
        size = 0
        while size < limit:
            part = await self.chunk(idle)
            if not part:
                break
            parts.append(part)
            size += len(part)
        return b"".join(parts)

    def release(self) -> None:
        """The caller is done: the connection is kept when the whole answer was read."""
        connection = self._connection
        if connection.response is not self:
            return
        connection.response = None
        whole = self._ended and not self._chunks
        connection.pool.give_back(connection, whole and connection.reusable)
        connection.pool.slot_freed()

    def close(self) -> None:
        """Abandon the exchange: the connection is closed, the upstream sees it go."""
        connection = self._connection
        if connection.response is not self:
            return
        connection.response = None
        connection.close()
        connection.pool.slot_freed()

    # -- from the connection ---------------------------------------------------------------

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _fail(self, error: BaseException) -> None:
        self._error = error
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_exception(error)


class UpstreamConnection(asyncio.Protocol):
    """One connection to the upstream: llhttp's callbacks fill the current response."""

    def __init__(self, pool: Owner) -> None:
        self.pool = pool
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.response: Response | None = None
        self._headers_waiter: asyncio.Future[None] | None = None
        self._head_only = False
        self.reusable = False
        self.answered = False
        self.sent_whole = False
        self.lost = False
        self._paused = False
        self._write_waiter: asyncio.Future[None] | None = None
        self._writing_paused = False
        self._deadline: float | None = None
        self._stall = Stall.FIRST_BYTE
        self._seconds = 0.0
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = 0.0
        self.loop = asyncio.get_running_loop()
        self.served = 0
        """Requests sent on this connection."""
        self.idle_since = 0.0
        """When its last answer was complete (the loop's clock)."""

    # -- one exchange ----------------------------------------------------------------------

    async def exchange(
        self, head: bytes, body: bytes | AsyncIterable[bytes] | None, bounds: Bounds,
        chunked: bool, head_only: bool,
    ) -> Response:  # fmt: skip
        transport = self.transport
        assert transport is not None
        response = self.response = Response(self)
        self.reusable = False
        self.answered = False
        self._head_only = head_only
        waiter = self._headers_waiter = self.loop.create_future()
        self.sent_whole = False
        self.served += 1
        if body is None or isinstance(body, bytes):
            transport.write(head + body if body else head)
            self.sent_whole = True
        else:
            transport.write(head)
            await self._upload(body, bounds, chunked)
        self.arm(bounds.first_byte, Stall.FIRST_BYTE)
        try:
            await waiter
        finally:
            self._headers_waiter = None
        return response

    async def _upload(self, body: AsyncIterable[bytes], bounds: Bounds, chunked: bool) -> None:
        """Write a relayed body as it comes, until it ends or the upstream stops taking it.

        An upstream may answer before the body is all sent (a 404 for an upload) and close:
        then the rest is not written (the answer is what counts), and the connection is not
        kept, since nobody can say where the upstream thinks the request ended.
        """
        async for part in body:
            transport = self.transport
            if self.lost or self.answered or transport is None or transport.is_closing():
                return
            self.arm(bounds.first_byte, Stall.FIRST_BYTE)
            if not part:
                continue
            if chunked:
                transport.write(b"%x\r\n%b\r\n" % (len(part), part))
            else:
                transport.write(part)
            if self._writing_paused:
                await self._drain()
        if self.lost or self.answered:
            return
        if chunked:
            assert self.transport is not None
            self.transport.write(b"0\r\n\r\n")
        self.sent_whole = True

    def arm(self, seconds: float, stall: Stall) -> None:
        """The current wait may last `seconds` from now (one lazily moved timer)."""
        deadline = self.loop.time() + seconds
        self._deadline = deadline
        self._stall = stall
        self._seconds = seconds
        if self._timer is None or self._timer_at > deadline:
            if self._timer is not None:
                self._timer.cancel()
            self._timer_at = deadline
            self._timer = self.loop.call_at(deadline, self._expire)

    def _expire(self) -> None:
        self._timer = None
        deadline = self._deadline
        if deadline is None or self.response is None:
            return
        if self.loop.time() < deadline:
            self._timer_at = deadline
            self._timer = self.loop.call_at(deadline, self._expire)
            return
        error = UpstreamTimeout(self._stall, self._seconds)
        headers_waiter = self._headers_waiter
        if headers_waiter is not None and not headers_waiter.done():
            headers_waiter.set_exception(error)
            self._wake_writer()  # an upload the upstream stopped taking ends too
        elif self._stall is Stall.IDLE and self.response._waiter is not None:
            self.response._fail(error)

    async def _drain(self) -> None:
        """Wait until the upstream takes more of an upload; raises the exchange's error
        (a timeout) when one came first."""
        self._write_waiter = self.loop.create_future()
        try:
            await self._write_waiter
        finally:
            self._write_waiter = None
        headers_waiter = self._headers_waiter
        if headers_waiter is not None and headers_waiter.done() and not self.answered:
            headers_waiter.result()  # raises the timeout that ended the wait

    def _wake_writer(self) -> None:
        waiter = self._write_waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def resume(self) -> None:
        if self._paused and self.transport is not None and not self.lost:
            self._paused = False
            self.transport.resume_reading()

    def close(self) -> None:
        if self.transport is not None and not self.lost:
            self.transport.close()
        self.lost = True
        self.pool.forget(self)

    # -- asyncio.Protocol ------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        if self.response is None:
            # Bytes nobody asked for: the connection's framing can no longer be trusted.
            self.close()
            return
        self.answered = True
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._broken(UpstreamInvalid(f"the upstream's answer is not valid HTTP: {exc}"))

    def eof_received(self) -> bool | None:
        return None  # close our side too; connection_lost follows

    def connection_lost(self, exc: BaseException | None) -> None:
        self.lost = True
        self.pool.forget(self)
        self._wake_writer()
        response = self.response
        if response is None or response._ended:
            return
        if response.status and response.content_length is None and not self._chunked():
            # Framed by the connection's end (no length, not chunked): this is the end.
            response._ended = True
            response._wake()
            return
        self._broken(UpstreamClosed("the upstream closed the connection mid-answer"))

    def pause_writing(self) -> None:
        self._writing_paused = True

    def resume_writing(self) -> None:
        self._writing_paused = False
        self._wake_writer()

    # -- llhttp callbacks ------------------------------------------------------------------

    def on_status(self, reason: bytes) -> None:
        assert self.response is not None
        self.response.reason = reason.decode("latin-1")

    def on_header(self, name: bytes, value: bytes) -> None:
        assert self.response is not None
        self.response.raw_headers.append((name, value))

    def on_headers_complete(self) -> None:
        response = self.response
        assert response is not None
        status = self.parser.get_status_code()
        if status < 200:
            # 100 Continue, 103 Early Hints: informational, the answer is still to come.
            response.raw_headers = []
            return
        response.status = status
        length = response.header(b"content-length")
        if length is not None and length.isdigit():
            response.content_length = int(length)
        self._deadline = None
        if self._head_only:
            # llhttp would wait for a body of Content-Length; the answer is complete.
            response._ended = True
            self.reusable = False
        waiter = self._headers_waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def on_body(self, body: bytes) -> None:
        response = self.response
        assert response is not None
        if response._ended:
            return
        response._chunks.append(body)
        response._buffered += len(body)
        if response._buffered > HIGH_WATER and not self._paused and self.transport is not None:
            self._paused = True
            self.transport.pause_reading()
        response._wake()

    def on_message_complete(self) -> None:
        response = self.response
        if response is None or not response.status:
            return  # the end of an informational answer
        if not self._head_only:
            response._ended = True
            # An answer that came before the whole request went up leaves the request's
            # end in doubt: that connection is never used again.
            self.reusable = self.sent_whole and self.parser.should_keep_alive()
        self._deadline = None
        response._wake()

    # -- failures --------------------------------------------------------------------------

    def _chunked(self) -> bool:
        assert self.response is not None
        value = self.response.header(b"transfer-encoding")
        return value is not None and b"chunked" in value.lower()

    def _broken(self, error: OSError) -> None:
        self._deadline = None
        waiter = self._headers_waiter
        if waiter is not None and not waiter.done():
            waiter.set_exception(error)
        elif self.response is not None:
            self.response._fail(error)
        if not self.lost and self.transport is not None:
            self.transport.close()
