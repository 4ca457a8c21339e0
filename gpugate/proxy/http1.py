"""The forwarding client's wire: one HTTP/1.1 connection to an upstream, nothing more.

A forwarded exchange is the gate's hottest path, and a general HTTP client does work a
proxy on loopback never needs: cookie jars, redirects, proxies, URL objects, per-request
timer objects, a response object and a stream reader per exchange. Here a request is one
`transport.write` of bytes the caller prepared, and the response is parsed by llhttp
(httptools, the parser of Node.js) as its bytes arrive, into a small buffer the caller
drains chunk by chunk (`Response`, and the errors an exchange ends with, in
http1_response.py). The connections are kept and handed out by pool.py.

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
import contextlib
import socket
from collections.abc import AsyncIterable, Callable
from typing import Protocol

import httptools

from gpugate.config.model import UpstreamTimeouts as Bounds
from gpugate.proxy.http1_response import (
    Keeper,
    Response,
    Stall,
    UpstreamClosed,
    UpstreamInvalid,
    UpstreamTimeout,
)

HIGH_WATER = 1 << 20
"""Bytes buffered from the upstream before reading from it pauses (the caller is slow)."""


class Unframed(bytes):
    """Bytes a chunked upload writes as they are, outside its framing (a chunked coding
    that broke at the client is sent up broken: forward.py `RelayedBody`)."""


class Owner(Keeper, Protocol):
    """What keeps a connection (pool.py): told when an exchange ends (`Keeper`) and when the
    connection is gone."""

    def forget(self, connection: UpstreamConnection) -> None:
        """`connection` is closed: it is no longer kept."""


class ClientEnd(Protocol):
    """The client's side of an exchange, whose half-close is passed on (request.py)."""

    ended: bool
    on_end: Callable[[], None] | None


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
        self.quick_ack = False
        """ACK what the upstream sends at once, not on the delayed-ACK timer (pool.py)."""
        self.ends_streams = False
        """The upstream closes the connection after a chunked answer (pool.py)."""
        self.eof_written = False
        """The client's half-close was passed on (`write_eof`): never reused."""

    # -- one exchange ----------------------------------------------------------------------

    async def exchange(
        self, head: bytes, body: bytes | AsyncIterable[bytes] | None, bounds: Bounds,
        chunked: bool, head_only: bool, client: ClientEnd | None = None,
    ) -> Response:  # fmt: skip
        """Send one request and return its answer's head; `client`, where the client's
        half-close is passed on, is told how once the request is sent (`write_eof`)."""
        transport = self.transport
        assert transport is not None
        response = self.response = Response(self)
        self.reusable = False
        self.answered = False
        self._head_only = head_only
        waiter = self._headers_waiter = self.loop.create_future()
        if stop_at := getattr(body, "stop_at", None):  # a relayed body ends at the answer
            stop_at(waiter)
        self.sent_whole = False
        self.served += 1
        if body is None or isinstance(body, bytes):
            transport.write(head + body if body else head)
            self.sent_whole = True
        else:
            transport.write(head)
            try:
                await self._upload(body, bounds, chunked)
            except BaseException:
                # The body broke (its client went): nobody waits for the answer's head now,
                # and an upstream closing after this must not leave an error unretrieved.
                self._headers_waiter = None
                if waiter.done() and not waiter.cancelled():
                    waiter.exception()
                else:
                    waiter.cancel()
                raise
        if client is not None:
            self._pass_on_end(client)
        if self.quick_ack:
            self._ack_at_once()
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
            if chunked and not isinstance(part, Unframed):
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

    def _pass_on_end(self, client: ClientEnd) -> None:
        """Half-close towards the upstream when the client has half-closed, now or while
        this exchange lasts (never once the connection carries another)."""
        if client.ended:
            self.write_eof()
            return
        response = self.response

        def ended() -> None:
            if self.response is response:
                self.write_eof()

        client.on_end = ended

    def write_eof(self) -> None:
        """End the request's side of the connection, as the client ended its own: the
        upstream's server reads that end as it would have read the client's."""
        transport = self.transport
        if transport is None or self.lost or transport.is_closing():
            return
        if not transport.can_write_eof():
            return
        self.eof_written = True
        self.reusable = False
        transport.write_eof()

    def _ack_at_once(self) -> None:
        """Leave Linux's interactive ("pingpong") ACK mode that sending a request enters:
        the answer's head is then ACKed as it arrives, and a server with Nagle on sends
        its body at once instead of after the 40 ms delayed-ACK timer (TCP_QUICKACK is
        not sticky: the next request sent enters the mode again, so each is followed by
        this)."""
        transport = self.transport
        sock = transport.get_extra_info("socket") if transport is not None else None
        if sock is not None and not self.lost:
            # Closed under us: the exchange's own read says so.
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_QUICKACK, 1)

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
            # A server that ends streams closes the connection after a chunked answer.
            ended = self.ends_streams and self._chunked()
            self.reusable = (
                self.sent_whole
                and self.parser.should_keep_alive()
                and not ended
                and not self.eof_written
            )
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
