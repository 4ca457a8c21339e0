"""Forwarding one HTTP exchange to an upstream runtime, streamed both ways.

Request bodies the adapter did not need are streamed up untouched; responses are
written down chunk by chunk as they arrive (NDJSON and SSE included) with no bytes
added. Hop-by-hop headers are dropped. Compressed bodies pass through compressed.
The client gets the upstream's headers and nothing of the gate's server software.

The request goes up over the listener's `UpstreamPool` (http1.py): its head is built
here from the client's raw header bytes, so what the runtime reads is what the client
wrote, less the hops and with the runtime's own address as Host. Every upstream call is
bounded (`Bounds`): connecting, the wait for response headers once the request is sent,
and the silence between two chunks of the body.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterator, Iterable, Mapping

from aiohttp import HttpVersion11, hdrs, web
from aiohttp.abc import AbstractStreamWriter
from multidict import CIMultiDict

from gpugate.config.model import UpstreamTimeouts as Bounds
from gpugate.proxy.http1 import (
    Response,
    Stall,
    UpstreamClosed,
    UpstreamInvalid,
    UpstreamPool,
    UpstreamTimeout,
)

__all__ = [
    "HOP_BY_HOP",
    "Bounds",
    "Stall",
    "UpstreamBroken",
    "UpstreamClosed",
    "UpstreamInvalid",
    "UpstreamTimeout",
    "cut_off",
    "open_upstream",
    "stream_down",
    "upstream_headers",
]

HOP_BY_HOP = frozenset(
    h.lower()
    for h in (
        "Connection",
        "Keep-Alive",
        "Proxy-Authenticate",
        "Proxy-Authorization",
        "Proxy-Connection",
        "TE",
        "Trailer",
        "Trailers",
        "Transfer-Encoding",
        "Upgrade",
    )
)
_HOP_BYTES = frozenset(h.encode() for h in HOP_BY_HOP)
FRAMING = frozenset({b"content-length", b"transfer-encoding"})
"""How a message's end is found. The gate frames what it sends itself, so the client's
framing headers are never copied, and a `Connection` header naming them (a hop-by-hop
list) changes nothing: a body the gate received always goes up framed by the gate."""
# Expect: the listener already answered 100 Continue, and the body goes up with the head.
_DROP_UP = _HOP_BYTES | FRAMING | {b"host", b"expect"}
_KEPT_FROM_CONNECTION = FRAMING | {b"host"}
"""Never taken as hop-by-hop because `Connection` names them: the gate sets them itself."""

_DROP_WS = HOP_BY_HOP | {"host"}


def _connection_tokens(headers: Mapping[str, str]) -> set[str]:
    value = headers.get(hdrs.CONNECTION, "")
    return {token.strip().lower() for token in value.split(",") if token.strip()}


def _named_hops(raw_headers: Iterable[tuple[bytes, bytes]]) -> set[bytes]:
    """The header names the client's `Connection` headers list, as bytes (any octets)."""
    named: set[bytes] = set()
    for name, value in raw_headers:
        if name.lower() == b"connection":
            named.update(t.strip().lower() for t in value.split(b",") if t.strip())
    return named - _KEPT_FROM_CONNECTION


def upstream_headers(
    request: web.BaseRequest, upstream_host: str, *, drop: Iterable[str] = ()
) -> CIMultiDict[str]:
    """The client's headers for an upgrade the websocket client sends upstream.

    `Host` becomes the upstream's own address, which every runtime's loopback host check
    accepts; headers the adapter already judged (`drop`, e.g. Origin) are not sent.
    """
    incoming = request.headers
    dropped = _DROP_WS | {name.lower() for name in drop} | _connection_tokens(incoming)
    out: CIMultiDict[str] = CIMultiDict(
        (n, v) for n, v in incoming.items() if n.lower() not in dropped
    )
    out[hdrs.HOST] = upstream_host
    _forwarded_for(request, out)
    return out


def _forwarded_for(request: web.BaseRequest, out: CIMultiDict[str]) -> None:
    peer = request.remote
    if peer:
        prior = request.headers.get("X-Forwarded-For")
        out["X-Forwarded-For"] = f"{prior}, {peer}" if prior else peer


@functools.cache
def _dropped(drop: tuple[str, ...]) -> frozenset[bytes]:
    """Request headers not copied upstream (a few combinations, each built once)."""
    return _DROP_UP | {b"x-forwarded-for"} | {name.lower().encode() for name in drop}


def request_head(
    request: web.BaseRequest,
    upstream_host: bytes,
    *,
    length: int | None,
    chunked: bool,
    close: bool,
    drop: Iterable[str] = (),
) -> bytes:
    """The request line and headers to send upstream, as bytes.

    The client's header lines are copied byte for byte, less the hops (and what the
    `Connection` header names), Host (the upstream's own address instead), Expect, the
    headers the adapter already judged (`drop`) and the client's framing. The framing is
    the gate's: `length` for a body of known length, `chunked` for a body relayed as it
    comes whose length is not known, neither for no body. A client's X-Forwarded-For is
    extended with its address.
    """
    dropped = _dropped(tuple(drop))
    incoming = request.headers
    if hdrs.CONNECTION in incoming:
        dropped = dropped | _named_hops(request.raw_headers)
    target = request.raw_path
    if not target.startswith("/"):
        target = str(request.rel_url)
    # The client's X-Forwarded-For is dropped from the copy and sent extended, last.
    forwarded = incoming.get("X-Forwarded-For")
    peer = request.remote
    if peer:
        forwarded = f"{forwarded}, {peer}" if forwarded else peer
    line = f"{request.method} {target} HTTP/1.1\r\nHost: ".encode("utf-8", "surrogateescape")
    parts = [line, upstream_host, b"\r\n"]
    for name, value in request.raw_headers:
        if name.lower() not in dropped:
            parts += (name, b": ", value, b"\r\n")
    if forwarded is not None:
        parts += (b"X-Forwarded-For: ", forwarded.encode("utf-8", "surrogateescape"), b"\r\n")
    if length is not None:
        parts.append(b"Content-Length: %d\r\n" % length)
    elif chunked:
        parts.append(b"Transfer-Encoding: chunked\r\n")
    if close:
        parts.append(b"Connection: close\r\n")
    parts.append(b"\r\n")
    return b"".join(parts)


class UpstreamBroken(Exception):
    """The upstream failed after the client's response had started: cut the client off."""

    def __init__(self, cause: BaseException, response: web.StreamResponse) -> None:
        super().__init__(str(cause))
        self.cause = cause
        self.response = response


async def open_upstream(
    pool: UpstreamPool,
    request: web.BaseRequest,
    upstream_host: bytes,
    body: bytes | None,
    bounds: Bounds,
    *,
    drop: Iterable[str] = (),
) -> Response:
    """Send the request upstream and return once response headers arrived.

    `body`: the whole body, as read (and perhaps rewritten) by the adapter; None relays
    the client's body, if it has one, as it arrives. Raises UpstreamTimeout when
    connecting takes longer than `bounds.connect`, or the headers longer than
    `bounds.first_byte` after the request (and its last body byte) went up; an OSError
    when the upstream cannot be reached or closes without an answer.
    """
    upload: bytes | AsyncIterator[bytes] | None = body
    length = None if body is None else len(body)
    chunked = False
    if body is None and request.body_exists:
        # aiohttp's payload reader ends the body where the client's framing says; the
        # upstream learns that end from the gate's own framing, never the client's.
        length = request.content_length
        upload = _relay_body(request, length)
        chunked = length is None
    head = request_head(
        request,
        upstream_host,
        length=length,
        chunked=chunked,
        close=not pool.keep_alive,
        drop=drop,
    )
    method = request.method
    return await pool.send(
        head,
        upload,
        bounds,
        chunked=chunked,
        head_only=method == hdrs.METH_HEAD,
        idempotent=method in IDEMPOTENT,
    )


IDEMPOTENT = frozenset({"GET", "HEAD", "OPTIONS", "TRACE", "PUT", "DELETE"})
"""Methods a client may send twice (RFC 9110 9.2.2): only these are sent again on a new
connection when a kept-alive one turns out closed."""


async def _relay_body(request: web.BaseRequest, length: int | None) -> AsyncIterator[bytes]:
    """The client's body as it arrives; one that ends short of `length` raises
    IncompleteReadError (the upstream must not take a short body as whole)."""
    sent = 0
    async for chunk in request.content.iter_any():
        sent += len(chunk)
        yield chunk
    if length is not None and sent != length:
        raise asyncio.IncompleteReadError(b"", length - sent)


def downstream_headers(
    upstream: Response, *, keep_length: bool = True
) -> tuple[list[tuple[str, str]], bool]:
    """The upstream's response headers for the client (all but the hops; Content-Length
    only if `keep_length`), and whether a Server header is among them."""
    drop: frozenset[bytes] | set[bytes] = _HOP_BYTES if keep_length else _HOP_AND_LENGTH
    connection = upstream.header(b"connection")
    if connection is not None:
        drop = drop | {t.strip().lower() for t in connection.split(b",") if t.strip()}
    out = []
    server = False
    for name, value in upstream.raw_headers:
        lowered = name.lower()
        if lowered not in drop:
            out.append((name.decode("latin-1"), value.decode("utf-8", "surrogateescape")))
            server = server or lowered == b"server"
    return out, server


_HOP_AND_LENGTH = _HOP_BYTES | {b"content-length"}


WHOLE_BODY_LIMIT = 256 * 1024
"""A response whose length the upstream announced and that is at most this big is sent
down in one write with its headers (a non-streamed answer), instead of chunk by chunk."""

UPSTREAM_SERVER = web.ResponseKey("gpugate.upstream_server", bool)
"""Marks a response whose Server header came from the upstream (kept; any other is dropped)."""


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
    body = b""
    if whole:
        assert length is not None
        body = await upstream.read(length + 1, idle) if length else b""
        if (
            request.version == HttpVersion11
            and request.keep_alive
            and (len(body) == length or head)
        ):
            return WholeAnswer(upstream, body, extra_headers)
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
        while True:
            try:
                chunk = await upstream.chunk(idle)
            except (UpstreamTimeout, OSError) as exc:
                raise UpstreamBroken(exc, response) from None
            if not chunk:
                break
            await response.write(chunk)
        await response.write_eof()
    except ConnectionError:
        # A write to the client failed: its side closed (aiohttp says so with a
        # ClientConnectionResetError, a ConnectionError like the upstream's own). That is
        # the client leaving, as when its going cancels the handler, never the runtime's
        # failure: the answer ends here, and the upstream connection, its body unread, is
        # closed by the caller.
        cut_off(request)
    return response


class WholeAnswer(web.StreamResponse):
    """A complete answer sent as the runtime wrote it: its status line and header lines
    byte for byte (less the hops), the gate's own headers after them, then the body, in
    one write. For a keep-alive HTTP/1.1 exchange whose body arrived whole and exactly as
    long as its Content-Length says; aiohttp adds nothing (no Date, Server or framing of
    its own: the runtime's are right as they are)."""

    def __init__(
        self, upstream: Response, body: bytes, extra_headers: Iterable[tuple[str, str]]
    ) -> None:
        super().__init__(status=upstream.status, reason=upstream.reason)
        drop: frozenset[bytes] | set[bytes] = _HOP_BYTES
        connection = upstream.header(b"connection")
        if connection is not None:
            drop = drop | {t.strip().lower() for t in connection.split(b",") if t.strip()}
        parts = [b"HTTP/1.1 %d %b\r\n" % (upstream.status, upstream.reason.encode("latin-1"))]
        for name, value in upstream.raw_headers:
            if name.lower() not in drop:
                parts += (name, b": ", value, b"\r\n")
        for name, value in extra_headers:
            parts += (name.encode(), b": ", value.encode("utf-8", "surrogateescape"), b"\r\n")
        parts += (b"\r\n", body)
        self._block = b"".join(parts)

    async def prepare(self, request: web.BaseRequest) -> AbstractStreamWriter | None:
        if self._payload_writer is not None or self._eof_sent:
            return self._payload_writer
        # As StreamResponse._start does, less the headers aiohttp would compose.
        writer = self._payload_writer = request._payload_writer
        self._req = request
        self._keep_alive = True
        await writer.write(self._block)
        return writer


def cut_off(request: web.BaseRequest) -> None:
    """End the client's connection now: what was sent stays, nothing marks the body complete."""
    transport = request.transport
    if transport is not None:
        transport.close()
