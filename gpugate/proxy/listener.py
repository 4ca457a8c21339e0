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
import logging
import math
from typing import Any

import aiohttp
import attrs
from aiohttp import hdrs, web
from multidict import CIMultiDict
from yarl import URL

from gpugate.core.classes import PriorityClass
from gpugate.core.failures import Failure, FailureClass
from gpugate.core.residents import ResidentKey
from gpugate.core.tickets import Demand, Lease, LeaseScope
from gpugate.gate.gate import Gate, GateFailure, Link
from gpugate.identity import PRIORITY_HEADER, IdentityResolver, resolve_priority
from gpugate.logs import OncePerInterval
from gpugate.proxy.forward import (
    UPSTREAM_SERVER,
    UpstreamBroken,
    UpstreamTimeout,
    cut_off,
    open_upstream,
    stream_down,
)
from gpugate.proxy.http1 import Response, UpstreamPool
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
from gpugate.proxy.websocket import WebSocketRelay, is_upgrade
from gpugate.runtimes.base import (
    AdapterError,
    Classified,
    ErrorReply,
    RouteKind,
    Screening,
    Vetted,
    error_reply,
    failure_reply,
)
from gpugate.runtimes.process import NotReady, ProcessExited
from gpugate.runtimes.process_ready import wait_ready

unvetted = OncePerInterval(logging.getLogger("gpugate.listener"), 60.0)

LEASE_HEADER = "X-GPUGate-Lease"
WAIT_HEADER = "X-GPUGate-Wait"
FAILURE_HEADER = "X-GPUGate-Failure"
ERROR_BODY_LIMIT = 1024 * 1024
OOM_MARKERS = ("out of memory", "cudamalloc failed", "cuda_error_out_of_memory", "oom")


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
    with the headers the runtime's own middleware would have put on it (CORS)."""
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
        dialect = adapter.dialect
        refused = framing_refusal(dialect, request)
        if refused is not None:
            return refused
        if hdrs.EXPECT in request.headers:
            refused = await answer_expect(dialect, request)
            if refused is not None:
                return refused
        screening = adapter.screen(method, request.headers, target=request.raw_path)
        if screening.reply is not None:
            return reply(screening.reply)
        body = None
        drop_up = screening.drop_up
        if adapter.wants_body(method, path):
            coding = decoded_coding(dialect, request) or adapter.decoded_coding(
                path, request.headers.get(hdrs.CONTENT_ENCODING, "")
            )
            limit = consumer.body_limit(adapter.body_limit.size)
            try:
                body = await read_body(request, limit)
                if coding is not None:
                    # The runtime's server inflates it before its handler reads it: the
                    # adapter reads, and the gate sends, what that handler would read.
                    body = decode_body(dialect, coding, body, limit)
                    drop_up = (*drop_up, hdrs.CONTENT_ENCODING)
            except BodyTooLarge as exc:
                too_large = adapter.body_limit.refusal
                if too_large is not None:
                    return reply(too_large(limit, exc.size, path))
                api = adapter.classify(method, path, None, "").api
                return reply(error_reply(api, 413, "http: request body too large"), screening)
            except asyncio.IncompleteReadError:
                api = adapter.classify(method, path, None, "").api
                return reply(error_reply(api, 400, "unexpected EOF"), screening)
            except Refused as exc:
                exc.response.headers.extend(screening.reply_headers)
                return exc.response
        classified = adapter.classify(
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
        if classified.kind is RouteKind.DEMAND and adapter.vets:
            vetted = await self._vet(classified)
            if vetted is not None:
                if vetted.reply is not None:
                    return reply(vetted.reply, screening)
                # The runtime refuses it before loading: it goes up unleased.
                classified = attrs.evolve(classified, kind=RouteKind.PASS)
        if classified.kind is RouteKind.PASS and is_upgrade(request):
            return await self._websocket(request, classified, screening)
        busy = None
        if self.gate.processes.fronts(self.link) and adapter.needs_process(method, path):
            # A process runtime: it must run (the gate starts it if it was stopped), and
            # it stays busy, never evicted, while this request is in flight.
            try:
                busy = await self.gate.processes.serve_lease(self.link, self._priority(request))
            except GateFailure as exc:
                return reply(failure_reply(classified.api, exc.failure), screening)
        try:
            lease = None
            if classified.kind is RouteKind.DEMAND:
                try:
                    lease = await self._admit(request, classified)
                except GateFailure as exc:
                    return reply(failure_reply(classified.api, exc.failure), screening)
            forward_body = classified.body if classified.body is not None else body
            return await self._forward(request, forward_body, lease, classified, screening)
        finally:
            if busy is not None:
                self.gate.release(busy)
            if classified.kind is RouteKind.UNLOAD:
                self.gate.want_reconcile(consumer.name)

    async def _vet(self, classified: Classified) -> Vetted | None:
        """The runtime's own refusal of a demand, before any lease (None: admit it). A
        runtime that cannot be asked in time only means the demand is admitted unvetted."""
        link = self.link
        assert link.session is not None
        try:
            # The adapter bounds its own calls (timeouts.control): an answer it already
            # has costs no timer here.
            return await link.adapter.vet(classified, link.session, self.gate.clock())
        except (TimeoutError, aiohttp.ClientError, AdapterError, OSError) as exc:
            unvetted.warning(
                f"{link.consumer.name}:{type(exc).__name__}",
                "%s: admitted a request unvetted; the runtime could not say whether it "
                "would refuse it (%s: %s)",
                link.consumer.name,
                type(exc).__name__,
                exc,
            )
            return None

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
        identity = self.identities.identify(request.remote, request.headers.get(hdrs.AUTHORIZATION))
        model_class = adapter.model_priority(model)
        priority = resolve_priority(identity, model_class, request.headers.get(PRIORITY_HEADER))
        if adapter.sizes_requests:
            ceiling = self.gate.ceiling(consumer.name, consumer.gpu, priority)
            envelope = adapter.size(classified, self.gate.measured_job(key), ceiling)
        if envelope is None:
            envelope = self.gate.known_envelope(self.link, model, classified.options_key)
        if envelope is None:
            envelope = await self.gate.envelope(self.link, model, classified.options_key)
        if envelope is None:
            return None
        residency = adapter.residency(model)
        demand = Demand(
            key=key,
            gpu=consumer.gpu,
            envelope=envelope,
            priority=priority,
            resident_priority=model_class,
            policy=residency.policy,
            idle_ttl=classified.idle_ttl,
            reload_seconds=adapter.reload_seconds(model, envelope),
            sets_ttl=classified.sets_ttl,
            scope=classified.scope,
            appear_within=classified.appear_within,
            replaces=(
                ResidentKey(consumer.name, classified.replaces) if classified.replaces else None
            ),
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
                upstream = await self._open(request, body, screening)
            except UpstreamTimeout as exc:
                return reply(
                    failure_reply(classified.api, self._timeout(classified, exc)), screening
                )
            except OSError as exc:
                failed = True
                return reply(failure_reply(classified.api, self._crash(classified, exc)), screening)
            except asyncio.IncompleteReadError:
                # The client's body ended short of its framing: the upstream connection was
                # closed with the request unfinished; nothing of it counts.
                refused = plain(400, b"400 Bad Request")
                refused.headers.extend(screening.reply_headers)
                return refused
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
                return reply(
                    failure_reply(classified.api, self._timeout(classified, exc)), screening
                )
            except OSError as exc:
                return reply(failure_reply(classified.api, self._crash(classified, exc)), screening)
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

    async def _open(
        self, request: web.BaseRequest, body: bytes | None, screening: Screening
    ) -> Response:
        """The upstream's answer's head. A process runtime whose process is there but not
        yet listening (its unit started it a moment ago: it loads before it binds) refuses
        the connection; nothing of the request went up then, so once its port and health
        route answer (within its start timeout) the request is sent once more."""
        timeouts = self.link.consumer.timeouts
        try:
            return await open_upstream(
                self.pool, request, self._host_bytes, body, timeouts, drop=screening.drop_up
            )
        except ConnectionRefusedError as exc:
            control = self.link.consumer.control
            # A request that does not start the process (GET /health) gets the refusal, and
            # so does any when no process is there to wait for (it exited).
            needs = self.link.adapter.needs_process(request.method, request.path)
            if control is None or not needs or not self.gate.processes.fronts(self.link):
                raise
            if not await self.gate.processes.running(self.link):
                raise
            refused = exc
        try:
            await wait_ready(self.link.consumer.upstream.url, control.health, control.start_timeout)
        except (NotReady, ProcessExited):
            raise refused from None
        return await open_upstream(
            self.pool, request, self._host_bytes, body, timeouts, drop=screening.drop_up
        )

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
            return reply(failure_reply(classified.api, self._timeout(classified, exc)), screening)
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            return reply(failure_reply(classified.api, self._crash(classified, exc)), screening)

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
