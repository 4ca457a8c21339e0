"""Explicit leases over the control API: ask (and wait), renew, release, list.

    POST   /gate/v1/leases              {"consumer"|"identity", "bytes", "class", "ttl", "max_wait",
                                         "purpose": "hold"|"start"}
    POST   /gate/v1/leases/{id}/renew
    DELETE /gate/v1/leases/{id}
    GET    /gate/v1/leases              ?scope=request,job,process,explicit

A lease is asked for by a configured consumer (its bytes are that consumer's, on its GPU)
or by a configured identity (its own budget row, `identity:NAME`, on `gpu`). The POST
answers once the lease is granted, or with the failure that ended the wait. Its `ttl` is
at most `gate.max_lease_ttl` (a longer one is a 400): the ttl is how long the bytes stay
leased after a holder that died stops renewing. A renewal extends by the ttl, cut to that
bound when a reload lowered it since the grant; its answer says the ttl from then on.

`"purpose": "start"` asks for a consumer's **start lease** (`gpugate admit`): `bytes`
default to the consumer's envelope and `ttl` to its `control.start_admission_timeout`; the
lease is never renewed, and ends as soon as NVML shows the consumer holding those bytes
(gpugate.gate.starts) or at its ttl. While one is held for a consumer, another start
request for it answers 200 with that same lease rather than counting the start twice.

The GET lists every lease the gate holds, each with its `scope`: `request`, `job` and
`process` leases the gate took for the runtimes' own requests, and `explicit` ones asked
for here. An explicit lease reads as it always did; the others have no `ttl` and no
`expires_in` (null: their request, job or process ends them) and say their `model` and
the bytes still `pending`. `?scope=explicit` lists only what this route listed before.
"""

from __future__ import annotations

import enum
import math
from typing import TYPE_CHECKING, Any

import attrs
from aiohttp import web

from gpugate.control.auth import CALLER, Caller
from gpugate.control.bodies import BadRequest, bad_request, json_body
from gpugate.core.classes import PriorityClass
from gpugate.core.explicit import IDENTITY_PREFIX, LeaseTerms, identity_owner
from gpugate.core.failures import Failure, FailureClass
from gpugate.core.job_leases import job_bytes
from gpugate.core.tickets import Lease
from gpugate.core.units import format_duration, parse_duration, parse_size
from gpugate.gate.process_books import DEFAULT_START_ADMISSION_TIMEOUT
from gpugate.gate.start_leases import StartLeases
from gpugate.gate.starts import ADOPT_FLOOR

if TYPE_CHECKING:
    from gpugate.config.model import Config
    from gpugate.gate.gate import Gate

DEFAULT_TTL = 30.0
FAILURE_HEADER = "X-GPUGate-Failure"


class Purpose(enum.Enum):
    """What an explicit lease is for."""

    HOLD = "hold"
    """Work that is not a request holds it, renewing it, until it releases it."""
    START = "start"
    """A process start: released once the process holds its bytes (gpugate.gate.starts)."""


class ShownScope(enum.Enum):
    """A lease's scope as the API shows it: the core's scopes, and explicit leases."""

    REQUEST = "request"
    JOB = "job"
    PROCESS = "process"
    EXPLICIT = "explicit"

    @classmethod
    def of(cls, lease: Lease) -> ShownScope:
        # An explicit lease is the only one with an expiry; its demand's scope is REQUEST.
        if lease.expires_at is not None:
            return cls.EXPLICIT
        return cls(lease.scope.value)


START_LEASES = web.AppKey("start_leases", StartLeases)


@attrs.frozen
class Asked:
    """A lease request as read from its body."""

    terms: LeaseTerms
    label: dict[str, str]
    """{"consumer": name} or {"identity": name}: how the holder is shown."""
    purpose: Purpose = Purpose.HOLD


def failure_response(failure: Failure) -> web.Response:
    """A failure as the control API answers it: its class's status, header and Retry-After."""
    headers = {FAILURE_HEADER: failure.failure_class.value}
    if failure.failure_class.is_capacity:
        retry = failure.retry_after if failure.retry_after is not None else 1.0
        headers["Retry-After"] = str(max(1, math.ceil(retry)))
    body = {"error": {"class": failure.failure_class.value, "message": failure.message}}
    return web.json_response(body, status=failure.failure_class.http_status, headers=headers)


def conflict(message: str) -> web.Response:
    return failure_response(Failure(FailureClass.LEASE_CONFLICT, f"LEASE_CONFLICT: {message}"))


def _seconds(body: dict[str, Any], key: str, default: float | None) -> float | None:
    value = body.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise BadRequest(f"{key}: expected seconds or a duration like '30s'")
    try:
        # Refuses NaN, negatives and what no clock could add (gpugate.core.units).
        return parse_duration(value)
    except ValueError as exc:
        raise BadRequest(f"{key}: {exc}") from None


def read_request(body: object, gate: Gate, caller: Caller) -> Asked:
    """The lease a body asks for, checked against the configuration and the caller."""
    if not isinstance(body, dict):
        raise BadRequest("expected a JSON object")
    known = {"consumer", "identity", "bytes", "class", "ttl", "max_wait", "gpu", "purpose"}
    unknown = sorted(set(body) - known)
    if unknown:
        allowed = ", ".join(sorted(known))
        raise BadRequest(f"unknown field(s) {', '.join(unknown)} (known: {allowed})")
    config = gate.config
    consumer_name, identity_name = body.get("consumer"), body.get("identity")
    if not caller.admin and consumer_name is None and identity_name is None:
        identity_name = caller.identity
    if (consumer_name is None) == (identity_name is None):
        raise BadRequest("give exactly one of 'consumer' and 'identity'")
    try:
        purpose = Purpose(body.get("purpose", Purpose.HOLD.value))
    except ValueError:
        raise BadRequest("purpose: expected 'hold' or 'start'") from None
    if purpose is Purpose.START and consumer_name is None:
        raise BadRequest("purpose: a start lease is a consumer's; give 'consumer'")
    raw_bytes = body.get("bytes")
    if raw_bytes is None and purpose is Purpose.START:
        raw_bytes = _start_envelope(config, consumer_name)
    if raw_bytes is None or isinstance(raw_bytes, bool) or not isinstance(raw_bytes, int | str):
        raise BadRequest("bytes: expected a whole number of bytes or a size like '4GiB'")
    try:
        nbytes = parse_size(raw_bytes)
    except ValueError as exc:
        raise BadRequest(f"bytes: {exc}") from None
    if nbytes <= 0:
        raise BadRequest(f"bytes: a lease must be for more than 0 bytes, got {raw_bytes!r}")
    if consumer_name is not None:
        if not caller.admin:
            raise BadRequest("an identity's token may hold leases only as that identity")
        consumer = next((c for c in config.consumers if c.name == consumer_name), None)
        if consumer is None:
            names = ", ".join(c.name for c in config.consumers) or "none"
            raise BadRequest(f"consumer: no consumer {consumer_name!r} (configured: {names})")
        gpu = body.get("gpu", consumer.cards[0])
        if isinstance(gpu, bool) or not isinstance(gpu, int) or gpu not in consumer.cards:
            cards = ", ".join(str(g) for g in consumer.cards)
            raise BadRequest(f"gpu: consumer {consumer.name} uses GPU {cards}")
        owner, default_class = consumer.name, consumer.priority
        max_class = PriorityClass.PRODUCTION
        label = {"consumer": consumer.name}
    else:
        identity = next((i for i in config.identities if i.name == identity_name), None)
        if identity is None:
            names = ", ".join(i.name for i in config.identities) or "none"
            raise BadRequest(f"identity: no identity {identity_name!r} (configured: {names})")
        if not caller.admin and caller.identity != identity.name:
            raise BadRequest(
                f"this token is identity {caller.identity!r}'s, not {identity.name!r}'s"
            )
        gpu = body.get("gpu", config.gpus[0].index if config.gpus else 0)
        if isinstance(gpu, bool) or not isinstance(gpu, int):
            raise BadRequest("gpu: expected an NVML index")
        known = {g.index for g in config.gpus} | set(gate.core.gpus())
        if gpu not in known:
            shown = ", ".join(str(g) for g in sorted(known)) or "none sampled yet"
            raise BadRequest(f"gpu: no GPU {gpu} (this gate's: {shown})")
        owner, default_class = identity_owner(identity.name), identity.priority
        max_class = identity.max_priority or identity.priority
        label = {"identity": identity.name}
    priority = default_class
    if body.get("class") is not None:
        try:
            priority = PriorityClass.parse(str(body["class"]))
        except ValueError as exc:
            raise BadRequest(f"class: {exc}") from None
    if not caller.admin and priority > max_class:
        raise BadRequest(f"class: {priority.label} is above this identity's {max_class.label}")
    default_ttl = DEFAULT_TTL
    if purpose is Purpose.START:
        default_ttl = _start_ttl(config, consumer_name)
    ttl = _seconds(body, "ttl", default_ttl)
    assert ttl is not None
    if ttl < 1:
        raise BadRequest("ttl: at least 1s, so that a renewal can arrive in time")
    longest = config.gate.max_lease_ttl
    # A start lease's default is the configuration's own (start_admission_timeout).
    if body.get("ttl") is not None and ttl > longest:
        raise BadRequest(
            f"ttl: at most {format_duration(longest)} (gate.max_lease_ttl), got "
            f"{format_duration(ttl)}: a holder that dies leaves its bytes leased for the "
            "ttl; ask for a shorter one and renew it"
        )
    max_wait = _seconds(body, "max_wait", None)
    budget = gate.core.budget(gpu)
    if budget is not None and nbytes > budget.total - budget.reserved:
        raise BadRequest(
            f"bytes: {nbytes} is more than GPU {gpu} has ({budget.total - budget.reserved} "
            "usable bytes)"
        )
    return Asked(LeaseTerms(owner, gpu, nbytes, priority, ttl, max_wait), label, purpose)


def _start_envelope(config: Config, name: object) -> int:
    consumer = next((c for c in config.consumers if c.name == name), None)
    if consumer is None:
        names = ", ".join(c.name for c in config.consumers) or "none"
        raise BadRequest(f"consumer: no consumer {name!r} (configured: {names})")
    if consumer.envelope is None:
        raise BadRequest(f"bytes: consumer {consumer.name!r} has no envelope to admit a start for")
    return consumer.envelope


def _start_ttl(config: Config, name: object) -> float:
    consumer = next((c for c in config.consumers if c.name == name), None)
    if consumer is None or consumer.control is None:
        return DEFAULT_START_ADMISSION_TIMEOUT
    return consumer.control.start_admission_timeout


def holder(lease: Lease) -> dict[str, str]:
    owner = lease.key.consumer
    if owner.startswith(IDENTITY_PREFIX):
        return {"identity": owner.removeprefix(IDENTITY_PREFIX)}
    return {"consumer": owner}


def lease_document(lease: Lease, now: float) -> dict[str, Any]:
    """An explicit lease as the API shows it (bytes and seconds)."""
    expires_at = lease.expires_at if lease.expires_at is not None else now
    return {
        "id": lease.id,
        **holder(lease),
        "gpu": lease.gpu,
        "bytes": lease.demand.envelope,
        "class": lease.demand.priority.label,
        "ttl": lease.demand.lease_ttl,
        "expires_in": round(max(0.0, expires_at - now), 3),
        "waited": round(lease.waited, 3),
        "held_for": round(now - lease.granted, 3),
        "scope": ShownScope.EXPLICIT.value,
    }


def gate_lease_document(lease: Lease, now: float) -> dict[str, Any]:
    """A lease the gate took for a runtime's request, job or process: an explicit lease's
    fields (no ttl, no expiry) with its model and the bytes still loading. A job shows its
    own size, though its consumer's job lease carries the bytes."""
    shown = job_bytes(lease)
    return {
        "id": lease.id,
        **holder(lease),
        "gpu": lease.gpu,
        "bytes": lease.demand.envelope if shown is None else shown,
        "class": lease.demand.priority.label,
        "ttl": None,
        "expires_in": None,
        "waited": round(lease.waited, 3),
        "held_for": round(now - lease.granted, 3),
        "scope": ShownScope.of(lease).value,
        "model": lease.key.model,
        "pending": lease.pending,
    }


def read_scopes(query: str | None) -> frozenset[ShownScope]:
    """`?scope=` as a set (comma-separated; none: every scope)."""
    if not query:
        return frozenset(ShownScope)
    try:
        return frozenset(ShownScope(word.strip()) for word in query.split(",") if word.strip())
    except ValueError:
        known = ", ".join(x.value for x in ShownScope)
        raise BadRequest(f"scope: expected some of {known}, got {query!r}") from None


def start_document(lease: Lease, now: float) -> dict[str, Any]:
    """A start lease as the API shows it: an explicit lease with `"purpose": "start"`."""
    return {**lease_document(lease, now), "purpose": Purpose.START.value}


async def not_held_yet(gate: Gate, terms: LeaseTerms) -> LeaseTerms:
    """A start lease asks only for what the consumer's processes do not hold already: with
    the process running (started by hand, or adopted), `admit` must not lease its memory a
    second time and evict others for it. Read from a sample taken now: one from before a
    restart's stop would still show the old process."""
    gate.observe(await gate.sampler.sample())
    observation = gate.core.observation(terms.gpu)
    held = 0 if observation is None else observation.managed.get(terms.owner, 0)
    if held <= 0:
        return terms
    return attrs.evolve(terms, bytes=max(ADOPT_FLOOR, terms.bytes - held))


def _allowed(caller: Caller, lease: Lease) -> bool:
    return caller.admin or lease.key.consumer == identity_owner(caller.identity or "")


def add_lease_routes(app: web.Application, gate: Gate) -> None:
    """Register the explicit-lease routes on the control app."""

    async def ask(request: web.Request) -> web.Response:
        from gpugate.gate.gate import GateFailure

        try:
            asked = read_request(await json_body(request), gate, request[CALLER])
        except BadRequest as exc:
            return bad_request(str(exc))
        terms = asked.terms
        if asked.purpose is Purpose.START:
            shared = starts.held(terms.owner)
            if shared is not None:
                return web.json_response(start_document(shared, gate.clock()))
            terms = await not_held_yet(gate, terms)
        try:
            lease = await gate.leases.hold(terms)
        except GateFailure as exc:
            return failure_response(exc.failure)
        if asked.purpose is Purpose.START:
            starts.watch(lease)
            return web.json_response(start_document(lease, gate.clock()), status=201)
        return web.json_response(lease_document(lease, gate.clock()), status=201)

    def held(request: web.Request) -> Lease | web.Response:
        try:
            lease_id = int(request.match_info["id"])
        except ValueError:
            return conflict(f"no lease {request.match_info['id']!r}")
        lease = next((x for x in gate.leases.explicit_leases() if x.id == lease_id), None)
        if lease is None or not _allowed(request[CALLER], lease):
            # Another identity's lease is answered as if absent: ids are not secrets.
            return conflict(
                f"lease {lease_id} is not held (it was released, it lapsed without a "
                "renewal, or it is not yours)"
            )
        return lease

    async def renew(request: web.Request) -> web.Response:
        found = held(request)
        if isinstance(found, web.Response):
            return found
        # A ttl granted before gate.max_lease_ttl was lowered (a reload) is cut to it here.
        lease = gate.leases.renew(found.id, gate.config.gate.max_lease_ttl)
        if lease is None:
            return conflict(f"lease {found.id} lapsed before this renewal arrived")
        return web.json_response(lease_document(lease, gate.clock()))

    async def release(request: web.Request) -> web.Response:
        found = held(request)
        if isinstance(found, web.Response):
            return found
        document = lease_document(found, gate.clock())
        gate.leases.release(found)
        return web.json_response({**document, "released": True})

    def shown(lease: Lease, now: float) -> dict[str, Any]:
        if ShownScope.of(lease) is not ShownScope.EXPLICIT:
            return gate_lease_document(lease, now)
        return (
            start_document(lease, now) if starts.is_start(lease.id) else lease_document(lease, now)
        )

    async def listing(request: web.Request) -> web.Response:
        try:
            scopes = read_scopes(request.query.get("scope"))
        except BadRequest as exc:
            return bad_request(str(exc))
        now = gate.clock()
        documents = [
            shown(x, now)
            for x in sorted(gate.core.leases(), key=lambda x: x.id)
            if ShownScope.of(x) in scopes
        ]
        return web.json_response({"leases": documents})

    # The gate's own: a start the gate runs itself holds its lease there, and admit joins it.
    starts = gate.starts
    app[START_LEASES] = starts

    app.router.add_post("/gate/v1/leases", ask)
    app.router.add_get("/gate/v1/leases", listing)
    app.router.add_post("/gate/v1/leases/{id}/renew", renew)
    app.router.add_delete("/gate/v1/leases/{id}", release)
