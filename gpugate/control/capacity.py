"""Capacity for routers: `GET /gate/v1/capacity` and the agent-check answer.

One function (`capacity`) computes what both say: per GPU the schedulable bytes, the
residents with their state and the queue's depth; per model the core's verdict
(`gpugate.core.capacity`): `resident`, `fits`, `after_eviction`, `no_room` or `unknown`,
with the bytes it needs and the bytes left for it. The route shows all of it as JSON; the
agent-check responder (`gpugate.control.agent`) turns the same numbers into HAProxy's one
line:

* `maint 0%`: the gate is unhealthy (what `/gate/v1/health` says: stale NVML samples, a
  consumer's signal gone quiet, ...);
* `drain 0%`: every GPU is paused, or none has `FLOOR` bytes schedulable; for a model:
  it would need an eviction, or there is no room for it now;
* `up ready N%`: the host's schedulable share of its memory (at least 1 %); for a model:
  100 % when it is resident, else the share left after loading it (1 to 99 %), so that a
  router can tell a host that has the model from one it merely fits on.

`ready` takes back a `drain` or `maint` the agent said before (HAProxy lets only the agent
undo its own states) and `0%` takes the server's weight down with them, so a rule that picks
the server holding a model by its weight never picks a drained one.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import attrs
from aiohttp import web

from gpugate.control.health import health_document
from gpugate.control.queue import queue, queue_documents
from gpugate.control.weights import (
    FLOOR,
    Answer,
    host_answer,
    model_answer,
    rank,
)
from gpugate.core.capacity import Ask, Assessment, assess
from gpugate.core.classes import PriorityClass
from gpugate.core.placement import Share, place
from gpugate.core.residents import Resident, ResidentKey
from gpugate.core.waits import Waiting, WaitReason
from gpugate.logs import OncePerInterval
from gpugate.runtimes.answers import ApiFamily, Classified, RouteKind
from gpugate.runtimes.parts import placing

if TYPE_CHECKING:
    from gpugate.gate.gate import Gate, Link

log = logging.getLogger("gpugate.control.capacity")
_warnings = OncePerInterval(log, 60.0)


class QueryError(ValueError):
    """A capacity question the gate cannot answer: an unknown consumer or class."""


@attrs.frozen
class Query:
    """Which models to assess: every one the gate knows of (all None), or one of them."""

    consumer: str | None = None
    model: str | None = None
    priority: PriorityClass | None = None
    """The requests' class (None: the model's own, as a request without identity gets)."""


@attrs.frozen
class ModelCapacity:
    """One model of one consumer: its verdict, the numbers behind it, its agent answer."""

    consumer: str
    model: str
    gpu: int
    priority: PriorityClass
    envelope: int | None
    envelope_source: str | None
    assessment: Assessment
    answer: Answer
    gpus: tuple[int, ...] = ()
    """The GPUs a load of it would be leased on: one, or each one a split load spans."""


@attrs.frozen
class Capacity:
    """Everything `/gate/v1/capacity` shows and the agent answers from."""

    ok: bool
    failed: tuple[str, ...]
    gpus: tuple[dict[str, Any], ...]
    models: tuple[ModelCapacity, ...]
    host: Answer

    def answer(self) -> Answer:
        """The agent's answer: for the models asked about (the best of them when several
        consumers have the model), else for the host."""
        if not self.models:
            return self.host
        return max(self.models, key=lambda m: rank(m.answer)).answer


def parse_query(gate: Gate, params: Mapping[str, str]) -> Query:
    """`consumer`, `model` and `class` of a capacity question; QueryError when unknown."""
    consumer = (params.get("consumer") or "").strip() or None
    if consumer is not None and consumer not in gate.links:
        names = {c.name for c in gate.config.consumers}
        fronted = ", ".join(sorted(gate.links)) or "none"
        if consumer in names:
            raise QueryError(
                f"consumer {consumer} is not fronted by this gate (fronted: {fronted})"
            )
        raise QueryError(f"unknown consumer {consumer!r} (fronted: {fronted})")
    model = params.get("model")
    if model is not None and not model.strip():
        raise QueryError("model is empty")
    klass = params.get("class")
    priority = None
    if klass is not None:
        try:
            priority = PriorityClass.parse(klass)
        except ValueError as exc:
            raise QueryError(str(exc)) from None
    return Query(consumer, None if model is None else model.strip(), priority)


def agent_query(gate: Gate, line: str) -> Query | None:
    """What an agent-send line asks about: `MODEL`, with `consumer=NAME` and `class=CLASS`
    in any order (`model=NAME` too). None: the host (an empty line). QueryError when the
    line is not such a question."""
    words = line.split()
    if not words:
        return None
    params: dict[str, str] = {}
    for word in words:
        key, sep, value = word.partition("=")
        if sep:
            if key not in ("consumer", "model", "class") or key in params:
                raise QueryError(f"cannot read {word!r}")
            params[key] = value
        elif "model" not in params:
            params["model"] = word
        else:
            raise QueryError(f"more than one model: {word!r}")
    if "model" not in params:
        raise QueryError("no model named")
    return parse_query(gate, params)


def capacity(gate: Gate, query: Query | None = None, *, models: bool = True) -> Capacity:
    """Per GPU and per model (the query's, or every one the gate knows of; none with
    `models` false), what this gate could take now. Read-only."""
    core = gate.core
    now = gate.clock()
    health = health_document(gate)
    ok = bool(health["ok"])
    failed = tuple(str(name) for name in health["failed"])
    paused = set(core.operator.paused())
    gpus = []
    totals: dict[int, int] = {}
    waiting = queue(gate)
    for index in core.gpus():
        budget = core.budget(index)
        if budget is None:
            continue
        totals[index] = budget.total
        age = core.sample_age(index, now)
        here = [row for row in waiting if row.gpu == index]
        gpus.append(
            {
                "gpu": index,
                "total": budget.total,
                "schedulable": budget.schedulable,
                "paused": index in paused,
                "pressure": core.in_pressure(index),
                "sample_age_seconds": None if age is None else round(age, 3),
                "queue_depth": len(here),
                "queued_bytes": queued_bytes(here),
                "queue": queue_documents(gate, here),
                "residents": [_resident(r, now) for r in core.residents(index)],
            }
        )
    host = host_answer(ok, failed, gpus)
    rows = tuple(
        _model(gate, link, name, query, ok, failed, totals, now)
        for link, name in (_models(gate, query or Query()) if models else ())
    )
    return Capacity(ok, failed, tuple(gpus), rows, host)


def queued_bytes(rows: list[Waiting]) -> int:
    """What the waiting demands will take before a new one: each load once (a ticket that
    rides on another's load of its model adds nothing)."""
    return sum(row.demand.envelope for row in rows if row.wait.reason is not WaitReason.SAME_MODEL)


def _resident(resident: Resident, now: float) -> dict[str, Any]:
    expires = resident.expires_at()
    return {
        "consumer": resident.key.consumer,
        "model": resident.key.model,
        "options": resident.key.options,
        "bytes": resident.bytes,
        "state": resident.state.value,
        "class": resident.priority.label,
        "policy": resident.policy.value,
        "in_flight": resident.in_flight,
        "idle_seconds": round(now - resident.last_used, 3) if resident.idle else 0.0,
        "expires_in_seconds": None if expires is None else round(expires - now, 3),
    }


def _models(gate: Gate, query: Query) -> list[tuple[Link, str]]:
    """(link, model key) pairs to assess: each fronted consumer's configured models and
    residents, or the one model asked about."""
    links = [gate.links[query.consumer]] if query.consumer else list(gate.links.values())
    known: dict[str, list[str]] = {}
    for link in links:
        model_key = link.runtime.settings.model_key
        names = [model_key(m.name) for m in link.consumer.models]
        names += [
            r.key.model for r in gate.core.residents() if r.key.consumer == link.consumer.name
        ]
        known[link.consumer.name] = list(dict.fromkeys(names))
    if query.model is None:
        return [(link, name) for link in links for name in known[link.consumer.name]]
    asked = [(link, link.runtime.settings.model_key(query.model)) for link in links]
    having = [(link, name) for link, name in asked if name in known[link.consumer.name]]
    # A model no consumer knows of yet may still be one a runtime has: ask every one.
    return having or asked


def _model(
    gate: Gate,
    link: Link,
    name: str,
    query: Query | None,
    ok: bool,
    failed: tuple[str, ...],
    totals: Mapping[int, int],
    now: float,
) -> ModelCapacity:
    settings = link.runtime.settings
    consumer = link.consumer
    known = gate.envelopes.known_from(consumer.name, link.runtime.memory, name, "")
    envelope, source = (None, None) if known is None else known
    model_class = settings.model_priority(name)
    priority = model_class if query is None or query.priority is None else query.priority
    residency = settings.residency(name)
    ask = Ask(
        key=ResidentKey(consumer.name, name),
        gpu=consumer.cards[0],
        envelope=envelope,
        priority=priority,
        resident_priority=model_class,
        policy=residency.policy,
        idle_ttl=residency.idle_ttl,
        reload_seconds=settings.reload_seconds(name, envelope or 0),
    )
    shares = _placed(gate, link, ask, now)
    split = len(shares) > 1
    assessments = [
        assess(
            gate.core,
            attrs.evolve(ask, gpu=share.gpu, envelope=share.bytes, key=ask.key.on(share.gpu))
            if split
            else attrs.evolve(ask, gpu=share.gpu),
            now,
        )
        for share in shares
    ]
    # A split load is as good as its worst part.
    assessment = max(assessments, key=lambda a: a.verdict.rank)
    gpu = shares[assessments.index(assessment)].gpu
    answer = model_answer(ok, failed, assessment, totals.get(gpu))
    return ModelCapacity(
        consumer.name,
        name,
        gpu,
        priority,
        envelope,
        source,
        assessment,
        answer,
        tuple(s.gpu for s in shares),
    )


def _placed(gate: Gate, link: Link, ask: Ask, now: float) -> tuple[Share, ...]:
    """Where a load of the model would be leased among the consumer's GPUs, as a request's
    would be (gpugate.core.placement)."""
    cards = link.consumer.cards
    if len(cards) == 1 or ask.envelope is None:
        return (Share(cards[0], ask.envelope or 0),)
    runtime_placement = link.runtime.placement
    asked = Classified(RouteKind.DEMAND, ApiFamily.PLAIN, ask.key.model)
    placement = place(
        gate.core,
        attrs.evolve(ask, gpu=cards[0]).demand(),
        cards,
        now,
        placing=placing(runtime_placement),
        rule=None if runtime_placement is None else runtime_placement.placement_rule(asked),
    )
    return placement.shares


def capacity_document(result: Capacity) -> dict[str, Any]:
    """`/gate/v1/capacity` as JSON: bytes and seconds."""
    return {
        "ok": result.ok,
        "failed": list(result.failed),
        "floor": FLOOR,
        "agent": _answer_document(result.host),
        "gpus": list(result.gpus),
        "models": [_model_document(m) for m in result.models],
    }


def _answer_document(answer: Answer) -> dict[str, Any]:
    return {
        "line": answer.line,
        "state": answer.state,
        "weight": answer.weight,
        "reason": answer.reason,
    }


def _model_document(row: ModelCapacity) -> dict[str, Any]:
    a = row.assessment
    return {
        "consumer": row.consumer,
        "model": row.model,
        "gpu": row.gpu,
        "gpus": list(row.gpus) or [row.gpu],
        "class": row.priority.label,
        "verdict": a.verdict.value,
        "plan": None if a.plan is None else a.plan.value,
        "needed": a.needed,
        "available": a.available,
        "schedulable": a.schedulable,
        "envelope": row.envelope,
        "envelope_source": row.envelope_source,
        "victims": [
            {"consumer": k.consumer, "model": k.model, "options": k.options} for k in a.victims
        ],
        "freed": a.freed,
        "blocked": None if a.blocked is None else a.blocked.value,
        "reason": a.reason,
        "agent": _answer_document(row.answer),
    }


def agent_answer(gate: Gate, line: str) -> Answer:
    """The agent-check answer to one request line (empty: the host's)."""
    try:
        query = agent_query(gate, line)
    except QueryError as exc:
        _warnings.log(
            logging.WARNING,
            "agent-query",
            "agent-check: answering for the host: %s in %r",
            exc,
            line[:80],
        )
        query = None
    if query is None:
        return capacity(gate, models=False).host
    return capacity(gate, query).answer()


def add_capacity_route(app: web.Application, gate: Gate) -> None:
    """`GET /gate/v1/capacity[?consumer=&model=&class=]`."""

    async def route(request: web.Request) -> web.Response:
        try:
            query = parse_query(gate, request.query)
        except QueryError as exc:
            return web.json_response(
                {"error": {"class": "BAD_REQUEST", "message": str(exc)}}, status=400
            )
        return web.json_response(capacity_document(capacity(gate, query)))

    app.router.add_get("/gate/v1/capacity", route)
