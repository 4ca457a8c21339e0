"""A client connection's requests as they come in: each head read by the dialect (its
refusals and the server's own answers written), each body framed by its head and fed to
the handler's `Body` as it arrives (server.py's `Connection` reads them so)."""

from __future__ import annotations

import asyncio
import enum
import logging

from gpugate.logs import OncePerInterval
from gpugate.proxy.dialects.base import Framing, HttpDialect, Refusal, RequestHead
from gpugate.proxy.request import Body, BodyBroken, Request, http_date

log = logging.getLogger("gpugate.listener")
limited = OncePerInterval(log, 30.0)

PIPELINE_BUFFER = 1 << 16
"""Bytes of requests after the one being answered held before the socket's reading pauses."""


class Phase(enum.Enum):
    """Where a connection is in its current request, and so which timer runs."""

    HEADERS = "headers"
    BODY = "body"
    HANDLING = "handling"
    IDLE = "idle"


class RequestReading:
    """The part of server.py's `Connection` that reads its requests: heads, then bodies
    (its state is `Connection`'s: the buffer, the request being read, its counts)."""

    def _head(self) -> RequestHead | None:
        """The next head in the buffer as the dialect reads it, after the bytes its server
        skips before a head; its refusals and own answers are written here (None: no
        request to hand on, for now or for good)."""
        while True:
            dialect = self.server.dialect
            if self._requests and len(self._buffer) < dialect.peek_before_next:
                return None  # the server waits for more before reading a next request
            skip = dialect.skip_before_head
            if skip is not None and self._last_method:
                drop = skip(self._buffer, self._last_method)
                if drop:
                    self._buffer = self._buffer[drop:]
                self._last_method = ""
            if not self._buffer:
                return None
            date = http_date()
            result = dialect.read_head(self._buffer, date)
            if result is None:
                return None
            if isinstance(result, Refusal):
                self._refuse(result)
                return None
            own = dialect.own_answer
            answer = own(result, date) if own is not None else None
            if answer is None:
                return result
            # An answer the server writes itself to a well-read head (Go's `OPTIONS *`):
            # no handler sees the request.
            transport = self.transport
            if transport is None:
                return None
            transport.write(answer.data)
            self._buffer = self._buffer[result.size :]
            if answer.close:
                self.linger()
                return None

    def _read_head(self) -> None:
        """Read the next request's head from the buffer and hand the request on."""
        result = self._head()
        if result is None:
            return
        request = self._start(result)
        if request is None:
            return
        nxt = self._next
        if nxt is not None and not nxt.done():
            nxt.set_result(request)
        else:
            self._task = asyncio.get_running_loop().create_task(self._serve(request))

    def _refuse(self, refusal: Refusal) -> None:
        transport = self.transport
        if transport is None:
            return
        limited.log(
            logging.INFO,
            f"{self.server.name}:malformed",
            "%s: refused a request its server would refuse, from %s",
            self.server.name,
            self.client,
        )
        transport.write(refusal.data)
        self._refusals += 1
        dialect = self.server.dialect
        if dialect.drops_read_ahead:
            # cpp-httplib reads each request through a stream of its own, so what it had
            # read past the refused head goes with it (dialects/httplib.py
            # `drops_read_ahead`); it reads on unless the refusal or the connection's
            # request count ends it (`keep_alive_max`).
            self._buffer = b""
            most = dialect.keep_alive_max
            if refusal.close or (most is not None and self.requests >= most):
                self.linger()
            return
        end = self._buffer.find(b"\r\n\r\n")
        if refusal.close or end < 0:
            self.linger()
            return
        self._buffer = self._buffer[end + 4 :]
        if self._buffer:
            self._read_head()

    def pause_body(self) -> None:
        self._body_paused = True
        self._pause_reading()

    def resume_body(self) -> None:
        if self._body_paused:
            self._body_paused = False
            self._resume_reading()

    def _start(self, head: RequestHead) -> Request | None:
        """A request whose head was read: its body framed, its timers set."""
        buffer = self._buffer[head.size :]
        self._buffer = b""
        self._rescan = 0
        self._last_method = head.method
        self._requests += 1
        framing = head.framing
        body = Body(
            self,
            head.length
            if framing is Framing.LENGTH
            else None
            if framing is not Framing.NONE
            else 0,
            exists=framing is not Framing.NONE,
        )
        request = Request(self, head, body)
        self._request = request
        if framing is Framing.NONE:
            self.phase = Phase.HANDLING
            self.server.handling(self)
            self._buffer = self._read_ahead(buffer)
            return request
        if head.expect_continue:
            body.expect(self.server.dialect.continue_rule, buffered=bool(buffer))
        if framing is Framing.LENGTH:
            self._left = head.length
        elif framing is Framing.UNTIL_CLOSE:
            # The body ends with the client's side of the connection (cpp-httplib 0.20
            # reads a POST with no framing so); that end closes the connection here.
            self._left = -1
        else:
            self._chunks = self.server.dialect.chunks()
        self.phase = Phase.BODY
        if framing is not Framing.LENGTH or len(buffer) < head.length:
            self.server.receiving(self)  # the body is still to come: its timer starts
        if buffer:
            self._feed_body(buffer)
        return request

    def _feed_body(self, data: bytes) -> None:
        request = self._request
        assert request is not None
        body = request.body
        chunks = self._chunks
        if chunks is None and self._left < 0:
            body.feed(data)
            return
        if chunks is None:
            take = self._left
            if len(data) <= take:
                body.feed(data)
                self._left -= len(data)
                rest = b""
            else:
                body.feed(data[:take])
                self._left = 0
                rest = data[take:]
            if self._left:
                return
        else:
            if self._unused:
                data, self._unused = self._unused + data, b""
            got = chunks.feed(data, http_date())
            body.feed(got.data)
            if got.refusal is not None or got.error:
                # A malformed coding: the server's own answer, or (Go) none, its handler
                # reading the error as a body cut short; the connection ends, but where
                # the refusal keeps it and the server drops what it read ahead
                # (cpp-httplib 0.20: a 400 from `read_content`, then a new stream reads
                # the next request from new bytes).
                self._chunks = None
                error: BaseException = (
                    BodyBroken(got.refusal)
                    if got.refusal is not None
                    else asyncio.IncompleteReadError(b"", None)
                )
                body.fail(error)
                self.phase = Phase.HANDLING
                self.server.handling(self)
                self.refused = not keeps_after(self.server.dialect, got.refusal)
                return
            rest = data[got.used :]
            if not got.done:
                # bytes the reader could not use yet (Go's: an unfinished trailer line)
                # are fed again with the next ones
                self._unused = rest
                return
            self._chunks = None
        body.finish()
        self.phase = Phase.HANDLING
        self.server.handling(self)
        rest = self._read_ahead(rest)
        if rest:
            self._buffer = rest
            if len(rest) > PIPELINE_BUFFER:
                self._pause_reading()

    def _read_ahead(self, rest: bytes) -> bytes:
        """What is kept of the bytes read past a request's end: all of them, for the
        next request, but where the dialect's server drops what it read ahead
        (cpp-httplib: a new stream and read buffer for each request,
        `process_server_socket`), so that a request pipelined behind another is lost
        as it is to that server."""
        if rest and self.server.dialect.drops_read_ahead:
            return b""
        return rest


def keeps_after(dialect: HttpDialect, refusal: Refusal | None) -> bool:
    """A refusal of a broken body after which the server reads the next request (from
    bytes that come after it: `drops_read_ahead`)."""
    return refusal is not None and not refusal.close and dialect.drops_read_ahead
