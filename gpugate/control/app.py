"""The control listener (loopback by default): /metrics and /gate/v1/."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from aiohttp import web
from prometheus_client.exposition import choose_encoder

from gpugate.control.auth import token_middleware
from gpugate.control.bodies import MAX_BODY, api_errors, bad_request
from gpugate.control.capacity import add_capacity_route
from gpugate.control.health import consumer_check, health_document
from gpugate.control.leases import add_lease_routes
from gpugate.control.live import BadFilter
from gpugate.control.marks import consumer_documents, pause_fields
from gpugate.control.metrics import GateMetrics
from gpugate.control.observe import add_observe_routes, filtered_events, follow_events
from gpugate.control.operator import add_operator_routes
from gpugate.control.queue import add_queue_route, queue, queue_documents
from gpugate.control.status_document import SCHEMA, budget_document

if TYPE_CHECKING:
    from gpugate.gate.gate import Gate

__all__ = ["consumer_check", "control_app", "gate_document", "health_document", "live_document"]

FILTERS = frozenset({"consumer", "class", "failure", "recent"})
"""Query parameters of `GET /gate/v1/events`: with any of them, lines carry wall time too."""


def gate_document(gate: Gate) -> dict[str, Any]:
    """The gate's budget, residents, leases and queue, in bytes and seconds; each GPU says
    whether it is paused and each consumer whether it is draining (since when, by whom)."""
    core = gate.core
    now = gate.clock()
    gpus = []
    for gpu in core.gpus():
        budget = core.budget(gpu)
        if budget is not None:
            document = budget_document(budget, core.sample_age(gpu, now))
            why = core.telemetry.reserve_why(gpu)
            gpus.append({**document, **pause_fields(gate, gpu), "reserve_reason": why.line()})
    fault = core.fault
    return {
        "schema": SCHEMA,
        "source": "gate",
        "nvml": None
        if fault is None
        else {"code": fault.code, "error": fault.name, "message": fault.message},
        "gpus": gpus,
        "residents": [
            {
                "consumer": r.key.consumer,
                "model": r.key.model,
                "options": r.key.options,
                "gpu": r.gpu,
                "spans": None
                if r.key.part is None
                else sorted(p.gpu for p in core.books.parts_of(r.key.whole)),
                "bytes": r.bytes,
                "state": r.state.value,
                "class": r.priority.label,
                "policy": r.policy.value,
                "in_flight": r.in_flight,
                "idle_seconds": round(now - r.last_used, 3) if r.in_flight == 0 else 0.0,
                "expires_in_seconds": None
                if (at := r.expires_at()) is None
                else round(at - now, 3),
                "out_of_band": r.out_of_band,
            }
            for r in sorted(core.residents(), key=lambda r: (r.gpu, -r.bytes))
        ],
        "leases": [
            {
                "id": lease.id,
                "consumer": lease.key.consumer,
                "model": lease.key.model,
                "gpu": lease.gpu,
                "class": lease.demand.priority.label,
                "pending": lease.pending,
                "waited_seconds": round(lease.waited, 3),
            }
            for lease in core.leases()
        ],
        "queue": queue_documents(gate, queue(gate)),
        "consumers": consumer_documents(gate),
    }


def live_document(gate: Gate) -> dict[str, Any]:
    """The status document with what the dashboard adds: wall time, pressure, health."""
    document = gate_document(gate)
    document["time"] = round(time.time(), 3)
    document["pressure"] = {str(gpu): gate.core.in_pressure(gpu) for gpu in gate.core.gpus()}
    health = health_document(gate)
    document["health"] = {"ok": health["ok"], "failed": health["failed"]}
    return document


def control_app(
    gate: Gate, metrics: GateMetrics, *, history_interval: float | None = None
) -> web.Application:
    async def status(request: web.Request) -> web.Response:
        return web.json_response(gate_document(gate))

    async def events(request: web.Request) -> web.StreamResponse:
        from gpugate.gate.events import event_json

        if request.query.get("follow", "0").lower() not in ("", "0", "false", "no"):
            return await follow_events(request, gate)
        if FILTERS.intersection(request.query):
            try:
                lines = filtered_events(request, gate)
            except BadFilter as exc:
                return bad_request(str(exc))
        else:
            lines = [event_json(e) for e in gate.recent_events()]
        return web.Response(
            text="\n".join(lines) + ("\n" if lines else ""), content_type="application/x-ndjson"
        )

    async def scrape(request: web.Request) -> web.Response:
        encoder, content_type = choose_encoder(request.headers.get("Accept", ""))
        body = encoder(metrics.registry)
        return web.Response(body=body, headers={"Content-Type": content_type})

    async def health(request: web.Request) -> web.Response:
        document = health_document(gate)
        return web.json_response(document, status=200 if document["ok"] else 503)

    app = web.Application(
        client_max_size=MAX_BODY,
        middlewares=[api_errors, token_middleware(lambda: gate.config)],
    )
    app.router.add_get("/metrics", scrape)
    app.router.add_get("/gate/v1/status", status)
    app.router.add_get("/gate/v1/events", events)
    app.router.add_get("/gate/v1/health", health)
    add_capacity_route(app, gate)
    add_queue_route(app, gate)
    add_lease_routes(app, gate)
    add_operator_routes(app, gate)
    add_observe_routes(app, gate, lambda: live_document(gate), history_interval=history_interval)
    return app
