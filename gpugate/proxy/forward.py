"""Forwarding one HTTP exchange to an upstream runtime, streamed both ways.

Request bodies the adapter did not need are streamed up untouched; responses are
written down chunk by chunk as they arrive (NDJSON and SSE included) with no bytes
added. Hop-by-hop headers are dropped. Compressed bodies pass through compressed.
The client gets the upstream's headers and nothing of the gate's server software.

Every upstream call is bounded (`UpstreamTimeouts`): connecting, the wait for response
headers once the request is sent, and the silence between two chunks of the body.
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import AsyncIterator, Iterable, Mapping

import aiohttp
from aiohttp import hdrs, web
from multidict import CIMultiDict
from yarl import URL

from gpugate.config.model import UpstreamTimeouts

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
    request: web.Request, upstream_host: str, *, body_replaced: bool, drop: Iterable[str] = ()
) -> dict[str, str] | CIMultiDict[str]:
    """The client's headers as the upstream should see them.

    `Host` becomes the upstream's own address, which every runtime's loopback host check
    accepts; headers the adapter already judged (`drop`, e.g. Origin) are not sent. A plain
    dict when no header repeats (the usual case, and cheaper for the client to take in); a
    multidict when one does.
    """
    incoming = request.headers
    dropped = _DROP_UP_REPLACED if body_replaced else _DROP_UP
    dropped = dropped | {name.lower() for name in drop}
    if hdrs.CONNECTION in incoming:
        dropped = dropped | _connection_tokens(incoming)
    out: dict[str, str] | CIMultiDict[str] = {}
    for name, value in incoming.items():
        if name.lower() in dropped:
            continue
        if name in out:
            out = CIMultiDict((n, v) for n, v in incoming.items() if n.lower() not in dropped)
            break
        out[name] = value
    out[hdrs.HOST] = upstream_host
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


class Stall(enum.Enum):
    """Where an upstream exchange ran out of time."""

    CONNECT = "connecting"
    FIRST_BYTE = "waiting for response headers"
    IDLE = "waiting for the next chunk of the response"


class UpstreamTimeout(Exception):
    """An upstream call passed one of its bounds."""

    def __init__(self, stall: Stall, seconds: float) -> None:
        super().__init__(f"no progress {stall.value} for {seconds:g}s")
        self.stall = stall
        self.seconds = seconds


class UpstreamBroken(Exception):
    """The upstream failed after the client's response had started: cut the client off."""

    def __init__(self, cause: BaseException, response: web.StreamResponse) -> None:
        super().__init__(str(cause))
        self.cause = cause
        self.response = response


async def open_upstream(
    session: aiohttp.ClientSession,
    request: web.Request,
    base_url: str,
    upstream_host: str,
    body: bytes | None,
    timeouts: UpstreamTimeouts,
    *,
    drop: Iterable[str] = (),
) -> aiohttp.ClientResponse:
    """Send the request upstream and return once response headers arrived.

    Raises UpstreamTimeout when connecting takes longer than `timeouts.connect`, or the
    headers take longer than `timeouts.first_byte` after the request (and its body) went up.
    """
    loop = asyncio.get_running_loop()
    bound = asyncio.timeout_at(loop.time() + timeouts.connect + timeouts.first_byte)
    if body is not None:
        data: object = body
    elif request.body_exists:
        data = _relay_body(request, bound, timeouts.first_byte)
    else:
        data = None
    headers = upstream_headers(request, upstream_host, body_replaced=body is not None, drop=drop)
    try:
        async with bound:
            return await session.request(
                request.method,
                URL(base_url + str(request.rel_url), encoded=True),
                headers=headers,
                data=data,
                allow_redirects=False,
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=timeouts.connect),
            )
    except aiohttp.ConnectionTimeoutError:
        raise UpstreamTimeout(Stall.CONNECT, timeouts.connect) from None
    except TimeoutError:
        if bound.expired():
            raise UpstreamTimeout(Stall.FIRST_BYTE, timeouts.first_byte) from None
        raise


async def _relay_body(
    request: web.Request, bound: asyncio.Timeout, first_byte: float
) -> AsyncIterator[bytes]:
    """The client's body as it arrives; the wait for headers counts from its last byte."""
    loop = asyncio.get_running_loop()
    async for chunk in request.content.iter_any():
        bound.reschedule(loop.time() + first_byte)
        yield chunk
    bound.reschedule(loop.time() + first_byte)


async def read_bounded(upstream: aiohttp.ClientResponse, limit: int, idle: float) -> bytes:
    """Up to `limit` bytes of the body (all of it when it is shorter), each chunk within `idle`."""
    chunks: list[bytes] = []
    size = 0
    while size < limit:
        chunk = await _next_chunk(upstream, idle)
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks)


async def _next_chunk(upstream: aiohttp.ClientResponse, idle: float) -> bytes:
    try:
        async with asyncio.timeout(idle):
            return await upstream.content.readany()
    except TimeoutError:
        raise UpstreamTimeout(Stall.IDLE, idle) from None


WHOLE_BODY_LIMIT = 256 * 1024
"""A response whose length the upstream announced and that is at most this big is sent
down in one write with its headers (a non-streamed answer), instead of chunk by chunk."""

UPSTREAM_SERVER = web.ResponseKey("gpugate.upstream_server", bool)
"""Marks a response whose Server header came from the upstream (kept; any other is dropped)."""


async def stream_down(
    request: web.Request,
    upstream: aiohttp.ClientResponse,
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
    """
    headers = downstream_headers(upstream)
    for name, value in extra_headers:
        headers.add(name, value)
    length = upstream.content_length
    if not prefix and length is not None and length <= WHOLE_BODY_LIMIT:
        body = await read_bounded(upstream, length + 1, idle) if length else b""
        if request.method != hdrs.METH_HEAD:
            headers.popall(hdrs.CONTENT_LENGTH, None)
        response: web.StreamResponse = web.Response(
            status=upstream.status, reason=upstream.reason, body=body, headers=headers
        )
        _mark_server(response, upstream)
        return response
    response = web.StreamResponse(status=upstream.status, reason=upstream.reason)
    response.headers.extend(headers)
    _mark_server(response, upstream)
    await response.prepare(request)
    try:
        if prefix:
            await response.write(prefix)
        while chunk := await _next_chunk(upstream, idle):
            await response.write(chunk)
    except (UpstreamTimeout, aiohttp.ClientError) as exc:
        raise UpstreamBroken(exc, response) from None
    await response.write_eof()
    return response


def _mark_server(response: web.StreamResponse, upstream: aiohttp.ClientResponse) -> None:
    if hdrs.SERVER in upstream.headers:
        response[UPSTREAM_SERVER] = True


async def drop_own_server(request: web.Request, response: web.StreamResponse) -> None:
    """on_response_prepare: no Server header unless the upstream sent it."""
    if not response.get(UPSTREAM_SERVER):
        response.headers.popall(hdrs.SERVER, None)


def cut_off(request: web.Request) -> None:
    """End the client's connection now: what was sent stays, nothing marks the body complete."""
    transport = request.transport
    if transport is not None:
        transport.close()
