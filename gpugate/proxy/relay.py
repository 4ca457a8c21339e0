"""The upstream's answer written down to the client as it arrives.

A complete answer, or a streamed one to a keep-alive HTTP/1.1 client, is written as the
runtime wrote it, with no server framework composing it again: the runtime's status line
and header lines byte for byte less the hops, the gate's own headers after them; aiohttp
adds nothing (no Date, Server or framing of its own: the runtime's are right as they are).

* `WholeAnswer`: a body that arrived whole and exactly as long as its Content-Length says,
  in one write with the head.
* `Relay`: a body relayed as it arrives (NDJSON, SSE, a large file). The gate frames it:
  as long as the runtime's Content-Length, else chunked. The head goes down at once when
  it came alone, else with the first body bytes in the same write; each later part is one
  write, with no wait unless the client's transport is over its high-water mark.

Anything else (an HTTP/1.0 client, one that closes after the answer, HEAD, 204 and 304)
goes through aiohttp's own response, which knows those rules.
"""

from __future__ import annotations

from collections.abc import Iterable

from aiohttp import HttpVersion11, hdrs, web
from aiohttp.abc import AbstractStreamWriter
from multidict import CIMultiDict

from gpugate.proxy.forward import HOP_BYTES
from gpugate.proxy.http1 import Response, UpstreamTimeout

LAST_CHUNK = b"0\r\n\r\n"
WHOLE_BODY_LIMIT = 256 * 1024
"""A response whose length the upstream announced and that is at most this big is sent
down in one write with its headers (a non-streamed answer), instead of chunk by chunk."""
NO_BODY = frozenset({204, 304})
"""Statuses whose answers have no body, whatever their headers say (aiohttp's rules)."""

UPSTREAM_SERVER = web.ResponseKey("gpugate.upstream_server", bool)
"""Marks a response whose Server header came from the upstream (kept; any other is dropped)."""


class UpstreamBroken(Exception):
    """The upstream failed after the client's response had started: cut the client off."""

    def __init__(self, cause: BaseException, response: web.StreamResponse) -> None:
        super().__init__(str(cause))
        self.cause = cause
        self.response = response


def cut_off(request: web.BaseRequest) -> None:
    """End the client's connection now: what was sent stays, nothing marks the body complete."""
    transport = request.transport
    if transport is not None:
        transport.close()


async def stream_down(
    request: web.BaseRequest,
    upstream: Response,
    extra_headers: Iterable[tuple[str, str]],
    idle: float,
    *,
    prefix: bytes = b"",
) -> web.StreamResponse:
    """Write the upstream's response to the client as it arrives.

    NDJSON and SSE streams have no Content-Length and are relayed chunk by chunk; a small
    answer of known length is already complete upstream, so it goes down in one piece (a
    HEAD answer keeps the upstream's Content-Length). Raises UpstreamTimeout when the
    upstream stalls before anything went down, UpstreamBroken when it stalls or fails after.
    A client that goes while its answer is written only ends the answer (its transport
    closed): nothing is raised for it.
    """
    length = upstream.content_length
    whole = not prefix and length is not None and length <= WHOLE_BODY_LIMIT
    head = request.method == hdrs.METH_HEAD
    kept = request.version == HttpVersion11 and request.keep_alive
    body = b""
    if whole:
        assert length is not None
        body = await upstream.read(length + 1, idle) if length else b""
        if kept and (len(body) == length or head):
            return WholeAnswer(upstream, body, extra_headers)
    elif kept and not head and upstream.status not in NO_BODY:
        return await _relay(request, upstream, extra_headers, idle, prefix)
    # A whole body's length is the gate's to send (aiohttp sets it), except for HEAD.
    headers, server = downstream_headers(upstream, keep_length=not whole or head)
    headers += extra_headers
    response: web.StreamResponse
    if whole:
        response = web.Response(
            status=upstream.status, reason=upstream.reason, body=body, headers=CIMultiDict(headers)
        )
        if server:
            response[UPSTREAM_SERVER] = True
        return response
    response = web.StreamResponse(status=upstream.status, reason=upstream.reason)
    response.headers.extend(headers)
    if server:
        response[UPSTREAM_SERVER] = True
    try:
        await response.prepare(request)
        if prefix:
            await response.write(prefix)
        await _pump(upstream, response, idle)
        await response.write_eof()
    except ConnectionError:
        _left(request)
    return response


async def _relay(
    request: web.BaseRequest,
    upstream: Response,
    extra_headers: Iterable[tuple[str, str]],
    idle: float,
    prefix: bytes,
) -> Relay:
    """`stream_down` for a keep-alive HTTP/1.1 client (`Relay`)."""
    response = Relay(upstream, extra_headers, chunked=upstream.content_length is None)
    await response.prepare(request)
    try:
        if prefix:
            await response.relay(prefix)
        elif not upstream.buffered and not upstream.complete:
            response.send_head()  # the runtime's head came alone: so does the gate's
        await _pump(upstream, response, idle)
        await response.write_eof()
    except ConnectionError:
        _left(request)
    return response


async def _pump(upstream: Response, response: web.StreamResponse, idle: float) -> None:
    """Each part of the body as it arrives, until its end."""
    while True:
        try:
            chunk = await upstream.chunk(idle)
        except (UpstreamTimeout, OSError) as exc:
            raise UpstreamBroken(exc, response) from None
        if not chunk:
            return
        await response.write(chunk)


def _left(request: web.BaseRequest) -> None:
    # A write to the client failed: its side closed (aiohttp says so with a
    # ClientConnectionResetError, a ConnectionError like the upstream's own). That is the
    # client leaving, as when its going cancels the handler, never the runtime's failure:
    # the answer ends here, and the upstream connection, its body unread, is closed by the
    # caller.
    cut_off(request)


def downstream_headers(
    upstream: Response, *, keep_length: bool = True
) -> tuple[list[tuple[str, str]], bool]:
    """The upstream's response headers for the client (all but the hops; Content-Length
    only if `keep_length`), and whether a Server header is among them."""
    drop = _dropped(upstream, HOP_BYTES if keep_length else _HOP_AND_LENGTH)
    out = []
    server = False
    for name, value in upstream.raw_headers:
        lowered = name.lower()
        if lowered not in drop:
            out.append((name.decode("latin-1"), value.decode("utf-8", "surrogateescape")))
            server = server or lowered == b"server"
    return out, server


_HOP_AND_LENGTH = HOP_BYTES | {b"content-length"}


def _dropped(upstream: Response, base: frozenset[bytes]) -> frozenset[bytes] | set[bytes]:
    """The header names not to pass down: `base` and what the runtime's `Connection` names."""
    connection = upstream.header(b"connection")
    if connection is None:
        return base
    return base | {t.strip().lower() for t in connection.split(b",") if t.strip()}


def runtime_head(
    upstream: Response, extra_headers: Iterable[tuple[str, str]], framing: bytes = b""
) -> bytes:
    """The runtime's status line and header lines less the hops (and what its `Connection`
    header names), then the gate's headers and `framing` (a header line), then the blank
    line."""
    drop = _dropped(upstream, HOP_BYTES)
    parts = [b"HTTP/1.1 %d %b\r\n" % (upstream.status, upstream.reason.encode("latin-1"))]
    for name, value in upstream.raw_headers:
        if name.lower() not in drop:
            parts += (name, b": ", value, b"\r\n")
    for name, value in extra_headers:
        parts += (name.encode(), b": ", value.encode("utf-8", "surrogateescape"), b"\r\n")
    parts += (framing, b"\r\n")
    return b"".join(parts)


class _Written(web.StreamResponse):
    """A response whose bytes the gate writes to the client's transport itself."""

    async def prepare(self, request: web.BaseRequest) -> AbstractStreamWriter | None:
        if self._payload_writer is not None or self._eof_sent:
            return self._payload_writer
        # As StreamResponse._start does, less the headers aiohttp would compose.
        writer = self._payload_writer = request._payload_writer
        self._req = request
        self._keep_alive = True
        return writer

    def _send(self, data: bytes) -> None:
        request = self._req
        transport = request.transport if request is not None else None
        if transport is None or transport.is_closing():
            # The client's side closed: a ConnectionError, as aiohttp's own writer raises.
            raise ConnectionResetError("Cannot write to closing transport")
        transport.write(data)

    async def _drain(self) -> None:
        """Wait while the client's transport holds more than its high-water mark."""
        request = self._req
        if request is not None and request.protocol.writing_paused:
            await request.writer.drain()

    def _ended(self) -> None:
        self._eof_sent = True
        self._req = None
        self._payload_writer = None


class WholeAnswer(_Written):
    """A complete answer sent in one write: the runtime's head, then its body (a keep-alive
    HTTP/1.1 exchange whose body arrived whole and exactly as long as its Content-Length)."""

    def __init__(
        self, upstream: Response, body: bytes, extra_headers: Iterable[tuple[str, str]]
    ) -> None:
        super().__init__(status=upstream.status, reason=upstream.reason)
        self._block = runtime_head(upstream, extra_headers) + body

    async def prepare(self, request: web.BaseRequest) -> AbstractStreamWriter | None:
        if self._payload_writer is not None or self._eof_sent:
            return self._payload_writer
        writer = await super().prepare(request)
        assert writer is not None
        await writer.write(self._block)
        return writer


class Relay(_Written):
    """A streamed answer relayed as its bytes arrive: `chunked` by the gate, else framed by
    the runtime's own Content-Length (kept among its header lines)."""

    def __init__(
        self, upstream: Response, extra_headers: Iterable[tuple[str, str]], *, chunked: bool
    ) -> None:
        super().__init__(status=upstream.status, reason=upstream.reason)
        framing = b"Transfer-Encoding: chunked\r\n" if chunked else b""
        self._head = runtime_head(upstream, extra_headers, framing)
        self._chunked = chunked

    def send_head(self) -> None:
        """Write the head now, ahead of any body (the runtime sent its own alone)."""
        if self._head:
            head, self._head = self._head, b""
            self._send(head)

    async def relay(self, data: bytes) -> None:
        """Write a part of the body (with the head, if that has not gone yet)."""
        if self._chunked:
            data = b"%x\r\n%b\r\n" % (len(data), data)
        if self._head:
            data = self._head + data
            self._head = b""
        self._send(data)
        await self._drain()

    async def write(self, data: bytes | bytearray | memoryview) -> None:  # type: ignore[override]
        await self.relay(bytes(data))

    async def write_eof(self, data: bytes = b"") -> None:
        if self._eof_sent:
            return
        if data:
            await self.relay(data)
        tail = LAST_CHUNK if self._chunked else b""
        if self._head:
            tail = self._head + tail
            self._head = b""
        if tail:
            self._send(tail)
        await self._drain()
        self._ended()
