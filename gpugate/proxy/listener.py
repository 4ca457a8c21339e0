"""One listener per fronted consumer: screen, classify, ask the gate once (`Requests.admit`
→ an `Exchange`), forward, and tell the exchange how it went (`answered`, `finish`).

A request's lease (REQUEST scope) is released in a `finally`: when the response is
complete, when the upstream fails or stalls past its timeouts, and when the client goes
away (the listener's server cancels the handler; the upstream request is closed at once,
so the runtime stops generating or aborts a load). An upstream that fails after the
response started is a failure event and a cut connection, never bytes added to the
client's stream.

A lease of another scope outlives the request once the runtime accepted it: a JOB lease
ends with its job (the runtime's name for the job is read from its answer), a
PROCESS lease when NVML shows the process's memory. If the runtime refused, the lease is
released here all the same.
"""

from __future__ import annotations

import asyncio
import functools
import math

import aiohttp
import attrs
from yarl import URL

from gpugate.gate.exchange import ERROR_BODY_LIMIT, FAILURE_HEADER, Caller, Exchange
from gpugate.gate.gate import Gate, GateFailure, Link
from gpugate.identity import PRIORITY_HEADER, IdentityResolver
from gpugate.proxy.dialects import dialect_of
from gpugate.proxy.forward import UpstreamTimeout, open_upstream
from gpugate.proxy.http1_response import Response
from gpugate.proxy.pool import UpstreamPool
from gpugate.proxy.reading import (
    Plain,
    Refused,
    decode_body,
    decoded_coding,
    plain,
)
from gpugate.proxy.relay import UpstreamBroken, send_answer, stream_down
from gpugate.proxy.request import BodyTooLarge, Request
from gpugate.proxy.websocket import WebSocketRelay, is_upgrade
from gpugate.runtimes.base import (
    ErrorReply,
    RouteKind,
    Screening,
    error_reply,
    failure_reply,
)

CONTENT_TYPE = "Content-Type"
CONTENT_ENCODING = "Content-Encoding"


def reply(request: Request, error: ErrorReply, screening: Screening | None = None) -> None:
    """Write an answer the gate makes itself, in the runtime's server's shape (its Date
    and framing, and the headers the runtime's own middleware would have put on it: CORS,
    and a `Server` header where the runtime's server sets one on every answer)."""
    headers: list[tuple[str, str]] = []
    if error.content_type:
        headers.append((CONTENT_TYPE, error.content_type))
    if error.failure_class:
        headers.append((FAILURE_HEADER, error.failure_class))
    if error.retry_after is not None:
        headers.append(("Retry-After", str(max(1, math.ceil(error.retry_after)))))
    headers.extend(error.headers)
    if screening is not None:
        headers.extend(screening.reply_headers)
    send_answer(request, error.status, headers, error.body)


def reply_plain(request: Request, answer: Plain, screening: Screening | None = None) -> None:
    """Write one of the server's own short answers (reading.py's)."""
    headers = list(answer.headers)
    if screening is not None:
        headers.extend(screening.reply_headers)
    send_answer(request, answer.status, headers, answer.body, close=answer.close)


class ConsumerListener:
    """The handler in front of one managed runtime (server.py serves its connections)."""

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
        self.dialect = dialect_of(link.runtime.reading.dialect)
        self.websockets = WebSocketRelay(self._base, self._host, link.consumer.timeouts)
        url = URL(upstream.url)
        assert url.host is not None and url.port is not None
        self.pool = UpstreamPool(
            url.host,
            url.port,
            keep_alive=link.runtime.reading.keep_alive,
            limit=upstream_connections or link.consumer.limits.upstream_connections,
        )

    async def close(self) -> None:
        """Close the upstream connections (the listener's sockets are closed already)."""
        await self.websockets.close()
        self.pool.close()

    async def handle(self, request: Request) -> None:
        """Screen, classify, admit, forward and release one request."""
        reading = self.link.runtime.reading
        consumer = self.link.consumer
        method, path = request.method, request.path
        headers = request.headers
        screening = reading.screen(method, headers, target=request.target)
        if screening.reply is not None:
            return reply(request, screening.reply)
        body = None
        drop_up = screening.drop_up
        if reading.wants_body(method, path):
            coding = decoded_coding(reading.dialect, request) or reading.decoded_coding(
                path, headers.get(CONTENT_ENCODING, "")
            )
            limit = consumer.body_limit(reading.body_limit.size)
            try:
                body = await request.body.read(limit)
                if coding is not None:
                    # The runtime's server inflates it before its handler reads it: the
                    # gate reads, and sends, what that handler would read.
                    body = decode_body(reading.dialect, coding, body, limit)
                    drop_up = (*drop_up, CONTENT_ENCODING)
            except BodyTooLarge as exc:
                # The rest of the body is not read: the server ends the connection after
                # the answer (server.py's `linger`), with no `Connection: close` of its own.
                too_large = reading.body_limit.refusal
                if too_large is not None:
                    return reply(request, too_large(limit, exc.size, path))
                api = reading.classify(method, path, None, "").api
                return reply(
                    request, error_reply(api, 413, "http: request body too large"), screening
                )
            except asyncio.IncompleteReadError:
                api = reading.classify(method, path, None, "").api
                return reply(request, error_reply(api, 400, "unexpected EOF"), screening)
            except Refused as exc:
                return reply_plain(request, exc.answer, screening)
        classified = reading.classify(
            method,
            path,
            body,
            headers.get(CONTENT_TYPE, ""),
            query=request.query,
        )
        if drop_up is not screening.drop_up:
            screening = attrs.evolve(screening, drop_up=drop_up)
        if classified.kind is RouteKind.REFUSE:
            assert classified.refusal is not None
            refusal = classified.refusal
            if refusal.exact is not None:
                return reply(request, refusal.exact, screening)
            return reply(
                request, error_reply(classified.api, refusal.status, refusal.message), screening
            )
        caller = Caller(
            self.identities,
            request.remote,
            headers.get("Authorization"),
            headers.get(PRIORITY_HEADER),
        )
        try:
            exchange = await self.admit(self.link, classified, caller, method, path)
        except GateFailure as exc:
            return reply(request, failure_reply(classified.api, exc.failure), screening)
        if exchange.refusal is not None:
            return reply(request, exchange.refusal, screening)
        try:
            if exchange.passes and is_upgrade(request):
                return await self._websocket(request, exchange, screening)
            forward_body = classified.body if classified.body is not None else body
            return await self._forward(request, forward_body, exchange, screening)
        finally:
            exchange.finish()

    async def _forward(
        self,
        request: Request,
        body: bytes | None,
        exchange: Exchange,
        screening: Screening,
    ) -> None:
        api = exchange.api
        timeouts = self.link.consumer.timeouts
        try:
            upstream = await self._open(request, body, exchange, screening)
        except UpstreamTimeout as exc:
            return reply(request, failure_reply(api, exchange.timed_out(exc)), screening)
        except GateFailure as exc:
            # A start its refused connection needed could not be had.
            return reply(request, failure_reply(api, exc.failure), screening)
        except OSError as exc:
            exchange.upstream_failed()
            return reply(request, exchange.not_answering(exc), screening)
        except asyncio.IncompleteReadError:
            # The client's body ended short of its framing: the upstream connection was
            # closed with the request unfinished; nothing of it counts.
            return reply_plain(request, plain(400, b"400 Bad Request"), screening)
        complete = False
        try:
            prefix = b""
            if exchange.wants_prefix(upstream.status):
                prefix = await upstream.read(ERROR_BODY_LIMIT, timeouts.idle)
            await exchange.accepted(upstream.status, prefix)
            extra = [*screening.response_headers, *exchange.answered(upstream.status, prefix)]
            await stream_down(request, upstream, extra, timeouts.idle, prefix=prefix)
            complete = True
        except UpstreamTimeout as exc:
            return reply(request, failure_reply(api, exchange.timed_out(exc)), screening)
        except OSError as exc:
            return reply(request, failure_reply(api, exchange.crashed(exc)), screening)
        except GateFailure as exc:
            # The runtime accepted a job whose lease cannot be had: it was withdrawn.
            return reply(request, failure_reply(api, exc.failure), screening)
        except UpstreamBroken as exc:
            if isinstance(exc.cause, UpstreamTimeout):
                exchange.timed_out(exc.cause)
            else:
                exchange.crashed(exc.cause)
            request.cut()
        finally:
            if complete:
                upstream.release()
            else:
                upstream.close()
        return None

    async def _open(
        self,
        request: Request,
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
        upstream = functools.partial(
            open_upstream,
            self.pool,
            request,
            self._host_bytes,
            body,
            timeouts,
            drop=screening.drop_up,
            target_as_sent=screening.target_as_sent,
        )
        try:
            return await upstream()
        except ConnectionRefusedError:
            request.forwarded = False  # back in the gate's hands while the process starts
            if not await exchange.process_coming_up():
                raise
        return await upstream()

    async def _websocket(self, request: Request, exchange: Exchange, screening: Screening) -> None:
        """A websocket upgrade that needs no lease, relayed frame by frame (websocket.py)."""
        api = exchange.api
        try:
            await self.websockets.relay(
                request,
                drop=screening.drop_up,
                extra_headers=screening.response_headers,
                on_drop=exchange.crashed,
            )
        except UpstreamTimeout as exc:
            return reply(request, failure_reply(api, exchange.timed_out(exc)), screening)
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            return reply(request, failure_reply(api, exchange.crashed(exc)), screening)
        return None
