"""One listener per fronted consumer: screen, classify, ask the gate once (`Requests.admit`
→ an `Exchange`), forward, and tell the exchange how it went (`answered`, `finish`).

A request's lease (REQUEST scope) is released in a `finally`: when the response is
complete, when the upstream fails or stalls past its timeouts, and when the client goes
away (aiohttp cancels the handler; the upstream request is closed at once, so the runtime
stops generating or aborts a load). An upstream that fails after the response started is
a failure event and a cut connection, never bytes added to the client's stream.

A lease of another scope outlives the request once the runtime accepted it: a JOB lease
ends with its job (the runtime's name for the job is read from its answer), a
PROCESS lease when NVML shows the process's memory. If the runtime refused, the lease is
released here all the same.
"""

from __future__ import annotations

import asyncio
import math
from typing import Any

import aiohttp
import attrs
from aiohttp import hdrs, web
from multidict import CIMultiDict
from yarl import URL

from gpugate.gate.exchange import ERROR_BODY_LIMIT, FAILURE_HEADER, Caller, Exchange
from gpugate.gate.gate import Gate, GateFailure, Link
from gpugate.identity import PRIORITY_HEADER, IdentityResolver
from gpugate.proxy.forward import UpstreamTimeout, open_upstream
from gpugate.proxy.http1 import Response
from gpugate.proxy.pool import UpstreamPool
from gpugate.proxy.reading import (
    BodyTooLarge,
    Refused,
    answer_expect,
    decode_body,
    decoded_coding,
    framing_refusal,
    plain,
    read_body,
)
from gpugate.proxy.relay import UPSTREAM_SERVER, UpstreamBroken, cut_off, stream_down
from gpugate.proxy.websocket import WebSocketRelay, is_upgrade
from gpugate.runtimes.base import (
    ErrorReply,
    RouteKind,
    Screening,
    error_reply,
    failure_reply,
)


class _ListenerRequest(web.BaseRequest):
    """A request to a listener: its answers carry no Server header but the upstream's."""

    async def _prepare_hook(self, response: web.StreamResponse) -> None:
        if not response.get(UPSTREAM_SERVER):
            response.headers.popall(hdrs.SERVER, None)


def _request(
    message: Any, payload: Any, protocol: Any, writer: Any, task: asyncio.Task[None]
) -> web.BaseRequest:
    """web.Server's request factory."""
    return _ListenerRequest(message, payload, protocol, writer, task, task.get_loop())


def reply(error: ErrorReply, screening: Screening | None = None) -> web.Response:
    """A response the gate writes itself (Date and Content-Length added as the runtime's),
    with the headers the runtime's own middleware would have put on it (CORS, and a
    `Server` header where the runtime's server sets one on every answer)."""
    headers: CIMultiDict[str] = CIMultiDict()
    if error.content_type:
        headers[hdrs.CONTENT_TYPE] = error.content_type
    if error.failure_class:
        headers[FAILURE_HEADER] = error.failure_class
    if error.retry_after is not None:
        headers[hdrs.RETRY_AFTER] = str(max(1, math.ceil(error.retry_after)))
    headers.extend(error.headers)
    if screening is not None:
        headers.extend(screening.reply_headers)
    response = web.Response(status=error.status, body=error.body, headers=headers)
    if hdrs.SERVER in headers:
        # The runtime's own words: kept, as an upstream's Server header is.
        response[UPSTREAM_SERVER] = True
    return response


class ConsumerListener:
    """The aiohttp application in front of one managed runtime."""

    def __init__(
        self,
        gate: Gate,
        link: Link,
        identities: IdentityResolver,
        *,
        upstream_connections: int | None = None,
    ) -> None:
        self.gate = gate
        self.admit = gate.requests.admit
        self.link = link
        self.identities = identities
        upstream = link.consumer.upstream
        self._base = upstream.url
        self._host = upstream.url.split("://", 1)[1]  # host:port, IPv6 in brackets
        self._host_bytes = self._host.encode("latin-1")
        self.websockets = WebSocketRelay(self._base, self._host, link.consumer.timeouts)
        url = URL(upstream.url)
        assert url.host is not None and url.port is not None
        self.pool = UpstreamPool(
            url.host,
            url.port,
            keep_alive=link.runtime.reading.keep_alive,
            limit=upstream_connections or link.consumer.limits.upstream_connections,
        )

    def server(self, **kwargs: Any) -> web.Server:
        """aiohttp's low-level server around `handle`: one handler for every path, so no
        router, application or middleware runs per request. `kwargs` go to web.Server."""
        return web.Server(self.handle, request_factory=_request, **kwargs)

    async def close(self) -> None:
        """Close the upstream connections (the listener's sockets are closed already)."""
        await self.websockets.close()
        self.pool.close()

    async def handle(self, request: web.BaseRequest) -> web.StreamResponse:
        """Screen, classify, admit, forward and release one request."""
        reading = self.link.runtime.reading
        consumer = self.link.consumer
        method, path = request.method, request.path
        dialect = reading.dialect
        refused = framing_refusal(dialect, request)
        if refused is not None:
            return refused
        if hdrs.EXPECT in request.headers:
            refused = await answer_expect(dialect, request)
            if refused is not None:
                return refused
        screening = reading.screen(method, request.headers, target=request.raw_path)
        if screening.reply is not None:
            return reply(screening.reply)
        body = None
        drop_up = screening.drop_up
        if reading.wants_body(method, path):
            coding = decoded_coding(dialect, request) or reading.decoded_coding(
                path, request.headers.get(hdrs.CONTENT_ENCODING, "")
            )
            limit = consumer.body_limit(reading.body_limit.size)
            try:
                body = await read_body(request, limit)
                if coding is not None:
                    # The runtime's server inflates it before its handler reads it: the
                    # gate reads, and sends, what that handler would read.
                    body = decode_body(dialect, coding, body, limit)
                    drop_up = (*drop_up, hdrs.CONTENT_ENCODING)
            except BodyTooLarge as exc:
                too_large = reading.body_limit.refusal
                if too_large is not None:
                    return reply(too_large(limit, exc.size, path))
                api = reading.classify(method, path, None, "").api
                return reply(error_reply(api, 413, "http: request body too large"), screening)
            except asyncio.IncompleteReadError:
                api = reading.classify(method, path, None, "").api
                return reply(error_reply(api, 400, "unexpected EOF"), screening)
            except Refused as exc:
                exc.response.headers.extend(screening.reply_headers)
                return exc.response
        classified = reading.classify(
            method,
            path,
            body,
            request.headers.get(hdrs.CONTENT_TYPE, ""),
            query=request.rel_url.raw_query_string,
        )
        if drop_up is not screening.drop_up:
            screening = attrs.evolve(screening, drop_up=drop_up)
        if classified.kind is RouteKind.REFUSE:
            assert classified.refusal is not None
            refusal = classified.refusal
            if refusal.exact is not None:
                return reply(refusal.exact, screening)
            return reply(error_reply(classified.api, refusal.status, refusal.message), screening)
        headers = request.headers
        caller = Caller(
            self.identities,
            request.remote,
            headers.get(hdrs.AUTHORIZATION),
            headers.get(PRIORITY_HEADER),
        )
        try:
            exchange = await self.admit(self.link, classified, caller, method, path)
        except GateFailure as exc:
            return reply(failure_reply(classified.api, exc.failure), screening)
        if exchange.refusal is not None:
            return reply(exchange.refusal, screening)
        try:
            if exchange.passes and is_upgrade(request):
                return await self._websocket(request, exchange, screening)
            forward_body = classified.body if classified.body is not None else body
            return await self._forward(request, forward_body, exchange, screening)
        finally:
            exchange.finish()

    async def _forward(
        self,
        request: web.BaseRequest,
        body: bytes | None,
        exchange: Exchange,
        screening: Screening,
    ) -> web.StreamResponse:
        api = exchange.api
        timeouts = self.link.consumer.timeouts
        try:
            upstream = await self._open(request, body, exchange, screening)
        except UpstreamTimeout as exc:
            return reply(failure_reply(api, exchange.timed_out(exc)), screening)
        except GateFailure as exc:
            # A start its refused connection needed could not be had.
            return reply(failure_reply(api, exc.failure), screening)
        except OSError as exc:
            exchange.upstream_failed()
            return reply(exchange.not_answering(exc), screening)
        except asyncio.IncompleteReadError:
            # The client's body ended short of its framing: the upstream connection was
            # closed with the request unfinished; nothing of it counts.
            refused = plain(400, b"400 Bad Request")
            refused.headers.extend(screening.reply_headers)
            return refused
        complete = False
        try:
            prefix = b""
            if exchange.wants_prefix(upstream.status):
                prefix = await upstream.read(ERROR_BODY_LIMIT, timeouts.idle)
            await exchange.accepted(upstream.status, prefix)
            extra = [*screening.response_headers, *exchange.answered(upstream.status, prefix)]
            response = await stream_down(request, upstream, extra, timeouts.idle, prefix=prefix)
            complete = True
            return response
        except UpstreamTimeout as exc:
            return reply(failure_reply(api, exchange.timed_out(exc)), screening)
        except OSError as exc:
            return reply(failure_reply(api, exchange.crashed(exc)), screening)
        except GateFailure as exc:
            # The runtime accepted a job whose lease cannot be had: it was withdrawn.
            return reply(failure_reply(api, exc.failure), screening)
        except UpstreamBroken as exc:
            if isinstance(exc.cause, UpstreamTimeout):
                exchange.timed_out(exc.cause)
            else:
                exchange.crashed(exc.cause)
            cut_off(request)
            return exc.response
        finally:
            if complete:
                upstream.release()
            else:
                upstream.close()

    async def _open(
        self,
        request: web.BaseRequest,
        body: bytes | None,
        exchange: Exchange,
        screening: Screening,
    ) -> Response:
        """The upstream's answer's head. A process runtime whose process is not listening
        (its unit started it a moment ago: it loads before it binds; or the gate stopped
        or started it after this request was admitted) refuses the connection; nothing of
        the request went up then, so once the exchange says it answers, the request is
        sent once more."""
        timeouts = self.link.consumer.timeouts
        try:
            return await open_upstream(
                self.pool, request, self._host_bytes, body, timeouts, drop=screening.drop_up
            )
        except ConnectionRefusedError:
            if not await exchange.process_coming_up():
                raise
        return await open_upstream(
            self.pool, request, self._host_bytes, body, timeouts, drop=screening.drop_up
        )

    async def _websocket(
        self, request: web.BaseRequest, exchange: Exchange, screening: Screening
    ) -> web.StreamResponse:
        """A websocket upgrade that needs no lease, relayed frame by frame (websocket.py)."""
        api = exchange.api
        try:
            return await self.websockets.relay(
                request,
                drop=screening.drop_up,
                extra_headers=screening.response_headers,
                on_drop=exchange.crashed,
            )
        except UpstreamTimeout as exc:
            return reply(failure_reply(api, exchange.timed_out(exc)), screening)
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            return reply(failure_reply(api, exchange.crashed(exc)), screening)
