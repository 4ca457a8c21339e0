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

from multidict import CIMultiDict

from gpugate.config.model import UpstreamTimeouts as Bounds
from gpugate.proxy.http1 import Unframed
from gpugate.proxy.http1_response import (
    Response,
    Stall,
    UpstreamClosed,
    UpstreamInvalid,
    UpstreamTimeout,
)
from gpugate.proxy.pool import UpstreamPool
from gpugate.proxy.request import BodyBroken, Request

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
    value = headers.get("Connection", "")
    return {token.strip().lower() for token in value.split(",") if token.strip()}


def upstream_headers(
    request: Request, upstream_host: str, *, drop: Iterable[str] = ()
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
    out["Host"] = upstream_host
    _forwarded_for(request, out)
    return out


def _forwarded_for(request: Request, out: CIMultiDict[str]) -> None:
    peer = request.remote
    if peer:
        prior = request.headers.get("X-Forwarded-For")
        out["X-Forwarded-For"] = f"{prior}, {peer}" if prior else peer


_DROP_UP_NAMES = frozenset(name.decode() for name in _DROP_UP)
_KEPT_NAMES = frozenset(name.decode() for name in _KEPT_FROM_CONNECTION)


@functools.cache
def _dropped(drop: tuple[str, ...]) -> frozenset[str]:
    """Request headers not copied upstream (a few combinations, each built once)."""
    return _DROP_UP_NAMES | {"x-forwarded-for"} | {name.lower() for name in drop}


def _named_hop_names(headers: Iterable[tuple[str, str]]) -> set[str]:
    """The header names the client's `Connection` headers list (in lower case)."""
    named: set[str] = set()
    for name, value in headers:
        if name.lower() == "connection":
            named.update(t.strip().lower() for t in value.split(",") if t.strip())
    return named - _KEPT_NAMES


ABSOLUTE_FORM = frozenset({"go", "aiohttp"})
"""Dialects whose server takes an absolute-form request-target (`GET http://host/path`)
as sent and routes on its path, so it goes up as the client sent it: Go's net/http keeps it
as `Request.RequestURI` and routes on `URL.Path` (request.go `readRequest`,
`url.ParseRequestURI`); aiohttp keeps it as `raw_path` and routes on its path
(web_request.py `BaseRequest.__init__`: `url.relative()`). cpp-httplib's dialect is
not among them: it is sent the origin form the gate routed on."""


def upstream_target(request: Request, *, as_sent: bool = True) -> str:
    """The request-target to send upstream: as the client sent it where its server takes
    absolute form (`ABSOLUTE_FORM`) and `as_sent`, else in origin form."""
    absolute = request.raw_path != request.target
    if as_sent and absolute and request.dialect.name in ABSOLUTE_FORM:
        return request.target
    return request.raw_path


def request_head(
    request: Request,
    upstream_host: bytes,
    *,
    length: int | None,
    chunked: bool,
    close: bool,
    drop: Iterable[str] = (),
    target_as_sent: bool = True,
) -> bytes:
    """The request line and headers to send upstream, as bytes.

    The client's header lines are copied byte for byte, less the hops (and what the
    `Connection` header names), Host (the upstream's own address instead), Expect, the
    headers the runtime's reading already judged (`drop`) and the client's framing; the
    target as `upstream_target` says (`target_as_sent`: the screening's). The framing is
    the gate's: `length` for a body of known length, `chunked` for a body relayed as it
    comes whose length is not known, neither for no body. A client's X-Forwarded-For is
    extended with its address.
    """
    dropped = _dropped(tuple(drop))
    incoming = request.headers
    if "Connection" in incoming:
        dropped = dropped | _named_hop_names(request.head.headers)
    # The client's X-Forwarded-For is dropped from the copy and sent extended, last.
    forwarded = incoming.get("X-Forwarded-For")
    peer = request.remote
    if peer:
        forwarded = f"{forwarded}, {peer}" if forwarded else peer
    target = upstream_target(request, as_sent=target_as_sent)
    host = upstream_host.decode("latin-1")
    data = _compose(
        request, target, dropped, host, forwarded, length=length, chunked=chunked, close=close
    )
    fits = request.dialect.fits
    if fits is None or fits(data):
        return data
    # The upstream's server would refuse the head the gate made of one it took from the
    # client, which the runtime at the gate's address would have served (Go: a head past
    # its read limit, `GoDialect.fits`; aiohttp: at most 128 fields, each field's name
    # measured with the name of the field before it, `AiohttpDialect.fits`): the
    # X-Forwarded-For is left out, and the Host goes where the client's was rather than
    # in front, so that every field of the client's keeps the neighbour it had; last, the
    # fields go with no space after the colon, none longer than the client's line (the
    # value as the server kept it, trimmed and unfolded).
    tries = [(True, None, ": ")]
    if "Host" in incoming:
        tries += [(False, forwarded, ": "), (False, None, ": ")]
    tries.append((True, None, ":"))
    for host_first, extended, separator in tries:
        refit = _compose(
            request,
            target,
            dropped,
            host,
            extended,
            length=length,
            chunked=chunked,
            close=close,
            host_first=host_first,
            separator=separator,
        )
        if fits(refit):
            return refit
    if "Host" not in incoming and not request.dialect.needs_host:
        # cpp-httplib: a server that reads no Host is sent none, as the client sent none
        bare = _compose(
            request, target, dropped, "", None, length=length, chunked=chunked, close=close
        )
        if fits(bare):
            return bare
    return data


def _compose(
    request: Request,
    target: str,
    dropped: frozenset[str] | set[str],
    host: str,
    forwarded: str | None,
    *,
    length: int | None,
    chunked: bool,
    close: bool,
    host_first: bool = True,
    separator: str = ": ",
) -> bytes:
    """The head `request_head` sends: the Host first (else in place of the client's,
    which `host_first` False expects), the client's kept fields (`separator` between
    name and value), the X-Forwarded-For, the framing and the close."""
    # Header lines are latin-1 text here (each byte one character): one encoding at the end
    # gives back the client's bytes.
    parts = [request.method, " ", target, " HTTP/1.1\r\n"]
    if host_first and host:
        parts += ("Host: ", host, "\r\n")
    for name, value in request.head.headers:
        lowered = name.lower()
        if lowered not in dropped:
            parts += (name, separator, value, "\r\n")
        elif not host_first and lowered == "host":
            parts += (name, separator, host, "\r\n")
            host_first = True  # placed: a second Host is dropped
    if forwarded is not None:
        parts += ("X-Forwarded-For: ", forwarded, "\r\n")
    if length is not None:
        parts += ("Content-Length: ", str(length), "\r\n")
    elif chunked:
        parts.append("Transfer-Encoding: chunked\r\n")
    if close:
        parts.append("Connection: close\r\n")
    parts.append("\r\n")
    return "".join(parts).encode("latin-1", "replace")


async def open_upstream(
    pool: UpstreamPool,
    request: Request,
    upstream_host: bytes,
    body: bytes | None,
    bounds: Bounds,
    *,
    drop: Iterable[str] = (),
    target_as_sent: bool = True,
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
    if body is None and request.body.exists:
        # The server ends the body where the client's framing says; the upstream learns
        # that end from the gate's own framing, never the client's.
        length = request.body.length
        upload = RelayedBody(request, length)
        chunked = length is None
    head = request_head(
        request,
        upstream_host,
        length=length,
        chunked=chunked,
        close=not pool.keep_alive,
        drop=drop,
        target_as_sent=target_as_sent,
    )
    method = request.method
    passes_end = request.dialect.answers_after_client_end
    request.forwarded = passes_end
    return await pool.send(
        head,
        upload,
        bounds,
        chunked=chunked,
        head_only=method == "HEAD",
        idempotent=method in IDEMPOTENT,
        client=request if passes_end else None,
    )


BROKEN_CHUNK = Unframed(b"x\r\n")
"""A chunk-size line without a hex digit, which every chunked decoder refuses."""

IDEMPOTENT = frozenset({"GET", "HEAD", "OPTIONS", "TRACE", "PUT", "DELETE"})
"""Methods a client may send twice (RFC 9110 9.2.2): only these are sent again on a new
connection when a kept-alive one turns out closed."""


class RelayedBody:
    """The client's body as it arrives, for the upstream; one that ends short of its
    `length` raises IncompleteReadError (the upstream must not take a short body as
    whole). It ends early once the upstream answered (`stop_at`): a runtime that answers
    a request before its body's end (ComfyUI answers a GET at once) is relayed at once."""

    def __init__(self, request: Request, length: int | None) -> None:
        self._body = request.body
        self._length = length
        self._sent = 0
        self._answered: asyncio.Future[None] | None = None
        self._relays_broken = request.dialect.relays_broken_body
        self._broken = False

    def stop_at(self, answered: asyncio.Future[None]) -> None:
        """End the body when `answered` is done (the upstream's answer's head came)."""
        self._answered = answered

    def __aiter__(self) -> RelayedBody:
        return self

    async def __anext__(self) -> bytes:
        if self._broken:
            raise StopAsyncIteration
        try:
            part = await self._body.next_part(self._answered)
        except BodyBroken:
            if not self._relays_broken:
                raise
            # The runtime's server reads a body only for a route that takes it: the broken
            # coding goes up broken, and the runtime answers as it would the client (a
            # route miss, never read; a route, its server's refusal of the coding).
            self._broken = True
            return BROKEN_CHUNK
        if part is None:
            raise StopAsyncIteration
        if not part:
            if self._length is not None and self._sent != self._length:
                raise asyncio.IncompleteReadError(b"", self._length - self._sent)
            raise StopAsyncIteration
        self._sent += len(part)
        return part
