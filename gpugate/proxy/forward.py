"""Forwarding one HTTP exchange to an upstream runtime: the way up (relay.py writes the
answer down).

Request bodies the runtime's reading did not need are streamed up untouched; responses are
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

from aiohttp import hdrs, web
from multidict import CIMultiDict

from gpugate.config.model import UpstreamTimeouts as Bounds
from gpugate.proxy.http1 import (
    Response,
    Stall,
    UpstreamClosed,
    UpstreamInvalid,
    UpstreamTimeout,
)
from gpugate.proxy.pool import UpstreamPool

__all__ = [
    "HOP_BYTES",
    "HOP_BY_HOP",
    "Bounds",
    "Stall",
    "UpstreamClosed",
    "UpstreamInvalid",
    "UpstreamTimeout",
    "open_upstream",
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
HOP_BYTES = frozenset(h.encode() for h in HOP_BY_HOP)
FRAMING = frozenset({b"content-length", b"transfer-encoding"})
"""How a message's end is found. The gate frames what it sends itself, so the client's
framing headers are never copied, and a `Connection` header naming them (a hop-by-hop
list) changes nothing: a body the gate received always goes up framed by the gate."""
# Expect: the listener already answered 100 Continue, and the body goes up with the head.
_DROP_UP = HOP_BYTES | FRAMING | {b"host", b"expect"}
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
    accepts; headers the runtime's reading already judged (`drop`, e.g. Origin) are not sent.
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
    headers the runtime's reading already judged (`drop`) and the client's framing. The framing is
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

    `body`: the whole body, as read (and perhaps rewritten) by the runtime's reading; None relays
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
