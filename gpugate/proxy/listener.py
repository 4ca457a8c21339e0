"""One listener per fronted consumer: screen, classify, admit under a lease, forward, release.

A request's lease (REQUEST scope) is released in a `finally`: when the response is
complete, when the upstream fails or stalls past its timeouts, and when the client goes
away (aiohttp cancels the handler; the upstream request is closed at once, so the runtime
stops generating or aborts a load). An upstream that fails after the response started is
a failure event and a cut connection, never bytes added to the client's stream.

A lease of another scope outlives the request once the runtime accepted it: a JOB lease
ends with its job (the adapter reads the runtime's name for the job from its answer), a
PROCESS lease when NVML shows the process's memory. If the runtime refused, the lease is
released here all the same.
"""

from __future__ import annotations

import asyncio
import math
from typing import Any

import aiohttp
from aiohttp import HttpVersion11, hdrs, web
from multidict import CIMultiDict
from yarl import URL

from gpugate.core.classes import PriorityClass
from gpugate.core.failures import Failure, FailureClass
from gpugate.core.residents import ResidentKey
from gpugate.core.tickets import Demand, Lease, LeaseScope
from gpugate.gate.gate import Gate, GateFailure, Link
from gpugate.identity import PRIORITY_HEADER, IdentityResolver, resolve_priority
from gpugate.proxy.forward import (
    UPSTREAM_SERVER,
    UpstreamBroken,
    UpstreamTimeout,
    cut_off,
    open_upstream,
    stream_down,
)
from gpugate.proxy.http1 import UpstreamPool
from gpugate.proxy.websocket import WebSocketRelay, is_upgrade
from gpugate.runtimes.base import (
    Classified,
    ErrorReply,
    RouteKind,
    Screening,
    error_reply,
    failure_reply,
)

LEASE_HEADER = "X-GPUGate-Lease"
WAIT_HEADER = "X-GPUGate-Wait"
FAILURE_HEADER = "X-GPUGate-Failure"
ERROR_BODY_LIMIT = 1024 * 1024
OOM_MARKERS = ("out of memory", "cudamalloc failed", "cuda_error_out_of_memory", "oom")


class BodyTooLarge(Exception):
    pass


async def read_body(request: web.BaseRequest, limit: int) -> bytes:
    """The whole request body, refusing more than `limit` bytes."""
    if request.content_length == 0:
        return b""
    if request.content_length is not None:
        if request.content_length > limit:
            raise BodyTooLarge
        content = request.content
        if content.is_eof():
            # All of it came with the headers (a small request): no wait, no copy per part.
            return content.read_nowait()
        return await content.readexactly(request.content_length)
    chunks = []
    size = 0
    async for chunk in request.content.iter_any():
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge
        chunks.append(chunk)
    return b"".join(chunks)


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


async def expect_continue(request: web.BaseRequest) -> web.StreamResponse | None:
    """`Expect: 100-continue` is answered before the body is read, as aiohttp's router
    does; any other expectation is refused with 417 (None: go on)."""
    expect = request.headers.get(hdrs.EXPECT, "")
    if request.version != HttpVersion11:
        return None
    if expect.lower() != "100-continue":
        return web.Response(status=417, text=f"Unknown Expect: {expect}")
    await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
    request.writer.output_size = 0
    await request.writer.drain()
    return None


def reply(error: ErrorReply) -> web.Response:
    """A response the gate writes itself (Date and Content-Length added as the runtime's)."""
    headers: CIMultiDict[str] = CIMultiDict()
    if error.content_type:
        headers[hdrs.CONTENT_TYPE] = error.content_type
    if error.failure_class:
        headers[FAILURE_HEADER] = error.failure_class
    if error.retry_after is not None:
        headers[hdrs.RETRY_AFTER] = str(max(1, math.ceil(error.retry_after)))
    headers.extend(error.headers)
    return web.Response(status=error.status, body=error.body, headers=headers)


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
            keep_alive=link.adapter.pool_connections,
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
        adapter = self.link.adapter
        consumer = self.link.consumer
        method, path = request.method, request.path
        if hdrs.EXPECT in request.headers:
            refused = await expect_continue(request)
            if refused is not None:
                return refused
        screening = adapter.screen(method, request.headers)
        if screening.reply is not None:
            return reply(screening.reply)
        body = None
        if adapter.wants_body(method, path):
            try:
                body = await read_body(request, consumer.max_body)
            except BodyTooLarge:
                api = adapter.classify(method, path, None, "").api
                return reply(error_reply(api, 413, "http: request body too large"))
            except asyncio.IncompleteReadError:
                api = adapter.classify(method, path, None, "").api
                return reply(error_reply(api, 400, "unexpected EOF"))
        classified = adapter.classify(
            method, path, body, request.headers.get(hdrs.CONTENT_TYPE, "")
        )
        if classified.kind is RouteKind.REFUSE:
            assert classified.refusal is not None
            refusal = classified.refusal
            return reply(error_reply(classified.api, refusal.status, refusal.message))
        if classified.kind is RouteKind.PASS and is_upgrade(request):
            return await self._websocket(request, classified, screening)
        busy = None
        if self.gate.processes.fronts(self.link):
            # A process runtime: it must run (the gate starts it if it was stopped), and
            # it stays busy, never evicted, while this request is in flight.
            try:
                busy = await self.gate.processes.serve_lease(self.link, self._priority(request))
            except GateFailure as exc:
                return reply(failure_reply(classified.api, exc.failure))
        try:
            lease = None
            if classified.kind is RouteKind.DEMAND:
                try:
                    lease = await self._admit(request, classified)
                except GateFailure as exc:
                    return reply(failure_reply(classified.api, exc.failure))
            forward_body = classified.body if classified.body is not None else body
            return await self._forward(request, forward_body, lease, classified, screening)
        finally:
            if busy is not None:
                self.gate.release(busy)
            if classified.kind is RouteKind.UNLOAD:
                self.gate.want_reconcile(consumer.name)

    def _priority(self, request: web.BaseRequest, model: str | None = None) -> PriorityClass:
        """The request's class: its identity's, else the model's (or the consumer's)."""
        adapter = self.link.adapter
        identity = self.identities.identify(request.remote, request.headers.get(hdrs.AUTHORIZATION))
        model = model or adapter.process_model()
        default = adapter.model_priority(model) if model else self.link.consumer.priority
        return resolve_priority(identity, default, request.headers.get(PRIORITY_HEADER))

    async def _admit(self, request: web.BaseRequest, classified: Classified) -> Lease | None:
        """A lease for a request that may load a model (None: the runtime will refuse it)."""
        assert classified.model is not None
        adapter = self.link.adapter
        consumer = self.link.consumer
        model = classified.model
        key = ResidentKey(consumer.name, model, classified.options_key)
        envelope = None
        if adapter.sizes_requests:
            ceiling = self.gate.ceiling(consumer.name, consumer.gpu)
            envelope = adapter.size(classified, self.gate.measured_job(key), ceiling)
        if envelope is None:
            envelope = self.gate.known_envelope(self.link, model, classified.options_key)
        if envelope is None:
            envelope = await self.gate.envelope(self.link, model, classified.options_key)
        if envelope is None:
            return None
        identity = self.identities.identify(request.remote, request.headers.get(hdrs.AUTHORIZATION))
        model_class = adapter.model_priority(model)
        residency = adapter.residency(model)
        demand = Demand(
            key=key,
            gpu=consumer.gpu,
            envelope=envelope,
            priority=resolve_priority(identity, model_class, request.headers.get(PRIORITY_HEADER)),
            resident_priority=model_class,
            policy=residency.policy,
            idle_ttl=classified.idle_ttl,
            reload_seconds=adapter.reload_seconds(model, envelope),
            sets_ttl=classified.sets_ttl,
            scope=classified.scope,
            appear_within=classified.appear_within,
        )
        return await self.gate.acquire(demand)

    async def _forward(
        self,
        request: web.BaseRequest,
        body: bytes | None,
        lease: Lease | None,
        classified: Classified,
        screening: Screening,
    ) -> web.StreamResponse:
        failed = lease is not None and lease.pending > 0
        kept = False  # the lease outlives this request: the runtime accepted a job or a start
        timeouts = self.link.consumer.timeouts
        try:
            try:
                upstream = await open_upstream(
                    self.pool, request, self._host_bytes, body, timeouts, drop=screening.drop_up
                )
            except UpstreamTimeout as exc:
                return reply(failure_reply(classified.api, self._timeout(classified, exc)))
            except OSError as exc:
                failed = True
                return reply(failure_reply(classified.api, self._crash(classified, exc)))
            complete = False
            self.link.adapter.answered(classified, upstream.status)
            try:
                extra = list(screening.response_headers)
                prefix = b""
                if lease is not None:
                    extra.append((LEASE_HEADER, str(lease.id)))
                    extra.append((WAIT_HEADER, f"{lease.waited:.3f}"))
                    if upstream.status < 400:
                        self.gate.loaded(lease)
                        failed = False
                        if lease.scope is LeaseScope.JOB:
                            prefix = await upstream.read(ERROR_BODY_LIMIT, timeouts.idle)
                            job = self.link.adapter.job_key(classified, prefix)
                            kind = ResidentKey(
                                self.link.consumer.name,
                                classified.model or "",
                                classified.options_key,
                            )
                            self.gate.job_started(lease, job, kind=kind, scale=classified.scale)
                        kept = not self.gate.released_by_caller(lease)
                    elif upstream.status >= 500 and lease.loads:
                        prefix = await upstream.read(ERROR_BODY_LIMIT, timeouts.idle)
                        failure = self._load_failure(classified, upstream.status, prefix)
                        self.gate.report(failure)
                        extra.append((FAILURE_HEADER, failure.failure_class.value))
                    else:
                        failed = lease.pending > 0
                response = await stream_down(request, upstream, extra, timeouts.idle, prefix=prefix)
                complete = True
                return response
            except UpstreamTimeout as exc:
                return reply(failure_reply(classified.api, self._timeout(classified, exc)))
            except OSError as exc:
                return reply(failure_reply(classified.api, self._crash(classified, exc)))
            except UpstreamBroken as exc:
                if isinstance(exc.cause, UpstreamTimeout):
                    self._timeout(classified, exc.cause)
                else:
                    self._crash(classified, exc.cause)
                cut_off(request)
                return exc.response
            finally:
                if complete:
                    upstream.release()
                else:
                    upstream.close()
        finally:
            if lease is not None and not kept:
                self.gate.release(lease, failed=failed)

    async def _websocket(
        self, request: web.BaseRequest, classified: Classified, screening: Screening
    ) -> web.StreamResponse:
        """A websocket upgrade that needs no lease, relayed frame by frame (websocket.py)."""
        try:
            return await self.websockets.relay(
                request,
                drop=screening.drop_up,
                extra_headers=screening.response_headers,
                on_drop=lambda exc: self._crash(classified, exc),
            )
        except UpstreamTimeout as exc:
            return reply(failure_reply(classified.api, self._timeout(classified, exc)))
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            return reply(failure_reply(classified.api, self._crash(classified, exc)))

    def _timeout(self, classified: Classified, exc: UpstreamTimeout) -> Failure:
        consumer = self.link.consumer
        failure = Failure(
            FailureClass.TIMEOUT,
            f"TIMEOUT: {consumer.name} at {consumer.upstream.url}: {exc}",
            consumer=consumer.name,
            model=classified.model,
            gpu=consumer.gpu,
        )
        self.gate.report(failure)
        return failure

    def _crash(self, classified: Classified, exc: BaseException) -> Failure:
        consumer = self.link.consumer
        failure = Failure(
            FailureClass.RUNTIME_CRASH,
            f"RUNTIME_CRASH: {consumer.name} at {consumer.upstream.url} is not answering "
            f"({exc.__class__.__name__}: {exc})",
            consumer=consumer.name,
            model=classified.model,
            gpu=consumer.gpu,
        )
        self.gate.report(failure)
        return failure

    def _load_failure(self, classified: Classified, status: int, body: bytes) -> Failure:
        text = body.decode("utf-8", "replace")
        lowered = text.lower()
        oom = any(marker in lowered for marker in OOM_MARKERS)
        cls = FailureClass.GPU_OOM if oom else FailureClass.MODEL_LOAD_FAILED
        consumer = self.link.consumer
        return Failure(
            cls,
            f"{cls.value}: {consumer.name} answered {status} loading {classified.model}: "
            f"{text.strip()[:300]}",
            consumer=consumer.name,
            model=classified.model,
            gpu=consumer.gpu,
        )
