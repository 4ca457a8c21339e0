"""The control listener (loopback by default): /metrics and /gate/v1/."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from aiohttp import web
from prometheus_client.exposition import choose_encoder

from gpugate.control.auth import token_middleware
from gpugate.control.leases import add_lease_routes
from gpugate.control.metrics import GateMetrics
from gpugate.control.observe import add_observe_routes, filtered_events, follow_events
from gpugate.control.operator import add_operator_routes
from gpugate.gate.links import ConsumerHealth
from gpugate.runtimes.base import HealthSignal
from gpugate.status import SCHEMA, budget_document

if TYPE_CHECKING:
    from gpugate.gate.gate import Gate

FILTERS = frozenset({"consumer", "class", "failure", "recent"})
"""Query parameters of `GET /gate/v1/events`: with any of them, lines carry wall time too."""


def gate_document(gate: Gate) -> dict[str, Any]:
    """The gate's budget, residents, leases and queue, in bytes and seconds."""
    core = gate.core
    now = gate.clock()
    gpus = []
    for gpu in core.gpus():
        budget = core.budget(gpu)
        if budget is not None:
            gpus.append(budget_document(budget, core.sample_age(gpu, now)))
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
        "queue": [
            {
                "ticket": t.id,
                "consumer": t.demand.consumer,
                "model": t.demand.model,
                "gpu": t.demand.gpu,
                "class": t.demand.priority.label,
                "bytes": t.demand.envelope,
                "waiting_seconds": round(now - t.arrived, 3),
                "deadline_in_seconds": round(t.deadline - now, 3),
            }
            for t in core.waiting()
        ],
    }


def consumer_check(health: ConsumerHealth) -> dict[str, Any]:
    """One consumer's health check, named by its signal (`listing` for a listed runtime)."""
    check: dict[str, Any] = {
        "check": health.signal.value,
        "consumer": health.consumer,
        "signal": health.signal.value,
        "ok": health.ok,
        "fresh": health.fresh,
        "age_seconds": None if health.age is None else round(health.age, 3),
        "limit_seconds": None if health.limit is None else round(health.limit, 3),
    }
    if health.signal is HealthSignal.PROCESS:
        check["stopped"] = health.stopped
    return check


def health_document(gate: Gate) -> dict[str, Any]:
    """Is the gate running on fresh data? One entry per check, with ages and limits.

    NVML: each GPU's last good sample must be younger than `budget.stale_after`, and the
    driver must not be failing. Consumers: each one's own signal (its listing, its health
    route, its process) must have answered well within its bound; a consumer with no signal
    is shown and never fails. The store must be open and writing. Health recovers by itself
    as soon as the data is fresh again.
    """
    core = gate.core
    now = gate.clock()
    checks: list[dict[str, Any]] = [{"check": "started", "ok": gate.started}]
    fault = core.fault
    if fault is not None:
        checks.append({"check": "nvml", "ok": False, "error": fault.name, "message": fault.message})
    limit = gate.config.budget.stale_after
    gpus = core.gpus()
    if not gpus:
        checks.append({"check": "nvml", "ok": False, "age_seconds": None, "limit_seconds": limit})
    for gpu in gpus:
        age = core.sample_age(gpu, now)
        checks.append(
            {
                "check": "nvml",
                "gpu": gpu,
                "ok": age is not None and age <= limit,
                "age_seconds": None if age is None else round(age, 3),
                "limit_seconds": limit,
            }
        )
    for link in gate.links.values():
        checks.append(consumer_check(gate.consumer_health(link, now)))
    store = gate.store
    if store is not None:
        # Admission does not wait on the store, but history, events and envelopes are not
        # being kept while it is down: an operator must see that here, not only in /metrics.
        checks.append(
            {
                "check": "store",
                "ok": store.healthy,
                "error": store.last_error,
                "buffered_records": store.buffered,
            }
        )
    ok = all(check["ok"] for check in checks)
    return {"ok": ok, "failed": [c["check"] for c in checks if not c["ok"]], "checks": checks}


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
            lines = filtered_events(request, gate)
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

    app = web.Application(middlewares=[token_middleware(lambda: gate.config)])
    app.router.add_get("/metrics", scrape)
    app.router.add_get("/gate/v1/status", status)
    app.router.add_get("/gate/v1/events", events)
    app.router.add_get("/gate/v1/health", health)
    add_lease_routes(app, gate)
    add_operator_routes(app, gate)
    add_observe_routes(app, gate, lambda: live_document(gate), history_interval=history_interval)
    return app
