"""Forwarding one HTTP exchange to an upstream runtime, streamed both ways.

Request bodies the adapter did not need are streamed up untouched; responses are
written down chunk by chunk as they arrive (NDJSON and SSE included) with no bytes
added. Hop-by-hop headers are dropped. Compressed bodies pass through compressed.
"""

from __future__ import annotations

from collections.abc import Mapping
from urllib.parse import urlsplit

import aiohttp
from aiohttp import hdrs, web
from multidict import CIMultiDict
from yarl import URL

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


_DROP_UP = HOP_BY_HOP | {"host"}
_DROP_UP_REPLACED = _DROP_UP | {"content-length"}


def _connection_tokens(headers: Mapping[str, str]) -> set[str]:
    value = headers.get(hdrs.CONNECTION, "")
    return {token.strip().lower() for token in value.split(",") if token.strip()}


def upstream_headers(
    request: web.Request, upstream_host: str, *, body_replaced: bool
) -> dict[str, str] | CIMultiDict[str]:
    """The client's headers as the upstream should see them.

    `Host` becomes the upstream's own address, which every runtime's loopback host check
    accepts; an `Origin` that was same-origin for the client stays same-origin for the
    upstream. Other origins pass unchanged, so the runtime's CORS rules still apply.
    A plain dict when no header repeats (the usual case, and cheaper for the client to
    take in); a multidict when one does.
    """
    incoming = request.headers
    drop = _DROP_UP_REPLACED if body_replaced else _DROP_UP
    if hdrs.CONNECTION in incoming:
        drop = drop | _connection_tokens(incoming)
    out: dict[str, str] | CIMultiDict[str] = {}
    for name, value in incoming.items():
        if name.lower() in drop:
            continue
        if name in out:
            out = CIMultiDict((n, v) for n, v in incoming.items() if n.lower() not in drop)
            break
        out[name] = value
    out[hdrs.HOST] = upstream_host
    origin = incoming.get(hdrs.ORIGIN)
    if origin:
        parts = urlsplit(origin)
        if parts.netloc and parts.netloc == request.host:
            out[hdrs.ORIGIN] = f"{parts.scheme}://{upstream_host}"
    peer = request.remote
    if peer:
        prior = incoming.get("X-Forwarded-For")
        out["X-Forwarded-For"] = f"{prior}, {peer}" if prior else peer
    return out


def downstream_headers(upstream: aiohttp.ClientResponse) -> CIMultiDict[str]:
    drop = HOP_BY_HOP | _connection_tokens(upstream.headers)
    out: CIMultiDict[str] = CIMultiDict()
    for name, value in upstream.headers.items():
        if name.lower() not in drop:
            out.add(name, value)
    return out


async def open_upstream(
    session: aiohttp.ClientSession,
    request: web.Request,
    base_url: str,
    upstream_host: str,
    body: bytes | None,
) -> aiohttp.ClientResponse:
    """Send the request upstream and return once response headers arrived."""
    if body is not None:
        data: object = body
    elif request.body_exists:
        data = request.content
    else:
        data = None
    headers = upstream_headers(request, upstream_host, body_replaced=body is not None)
    return await session.request(
        request.method,
        URL(base_url + str(request.rel_url), encoded=True),
        headers=headers,
        data=data,
        allow_redirects=False,
    )


WHOLE_BODY_LIMIT = 256 * 1024
"""A response whose length the upstream announced and that is at most this big is sent
down in one write with its headers (a non-streamed answer), instead of chunk by chunk."""


async def stream_down(
    request: web.Request,
    upstream: aiohttp.ClientResponse,
    extra_headers: Mapping[str, str],
    *,
    prefix: bytes = b"",
) -> web.StreamResponse:
    """Write the upstream's response to the client as it arrives.

    NDJSON and SSE streams have no Content-Length and are relayed chunk by chunk; a small
    answer of known length is already complete upstream, so it goes down in one piece.
    """
    length = upstream.content_length
    if not prefix and length is not None and length <= WHOLE_BODY_LIMIT:
        body = await upstream.read()
        headers = downstream_headers(upstream)
        headers.popall(hdrs.CONTENT_LENGTH, None)
        headers.update(extra_headers)
        return web.Response(
            status=upstream.status, reason=upstream.reason, body=body, headers=headers
        )
    response = web.StreamResponse(status=upstream.status, reason=upstream.reason)
    response.headers.extend(downstream_headers(upstream))
    for name, value in extra_headers.items():
        response.headers[name] = value
    await response.prepare(request)
    if prefix:
        await response.write(prefix)
    async for chunk in upstream.content.iter_any():
        await response.write(chunk)
    await response.write_eof()
    return response
