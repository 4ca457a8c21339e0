"""Capacity for routers: could a request for this model be served here right now, and how?

For one model (a consumer, a model, its class and its envelope) the answer is a verdict:

* `resident`: a loaded copy serves it (or one is loading, and it rides on that load);
* `fits`: it would be granted at once, loading into free memory, nothing evicted;
* `after_eviction`: it would be granted once idle residents the planner may take for its
  class (lower class, or equal after the idle grace) are unloaded;
* `no_room`: not now: it would wait, fail, or is refused (its consumer drains, its GPU is
  paused, samples are stale, its consumer's queue is full);
* `unknown`: no envelope is known for it, so nothing can be said before the runtime is asked.

Read-only and pure like the rest of the core: it plans the demand exactly as
`GateCore.submit` would — the operator's marks first, then a resident that serves it, the
samples' freshness, the pool the queue ahead of it leaves, and the planner's own rules —
and changes nothing. The tests hold it to that: a `fits` is granted without an eviction
when submitted at once, an `after_eviction` is planned as an eviction.
"""

from __future__ import annotations

import enum

import attrs

from gpugate.core import early
from gpugate.core.books import loading_resident
from gpugate.core.classes import PriorityClass, ResidencyPolicy
from gpugate.core.planner import Plan, PlanKind, plan, reusable
from gpugate.core.residents import Resident, ResidentKey, ResidentState
from gpugate.core.scheduling import UNEXPLAINED
from gpugate.core.state import GateCore
from gpugate.core.tickets import Demand
from gpugate.core.views import ResidentView

__all__ = ["Ask", "Assessment", "Blocked", "Verdict", "assess"]


class Verdict(enum.Enum):
    RESIDENT = "resident"
    FITS = "fits"
    AFTER_EVICTION = "after_eviction"
    NO_ROOM = "no_room"
    UNKNOWN = "unknown"

    @property
    def rank(self) -> int:
        """Best first: served as it is, loaded into free memory, after evictions, then the
        ones that say nothing can be had now (not known before none at all)."""
        return _VERDICT_RANKS[self]


_VERDICT_RANKS = {
    Verdict.RESIDENT: 0,
    Verdict.FITS: 1,
    Verdict.AFTER_EVICTION: 2,
    Verdict.UNKNOWN: 3,
    Verdict.NO_ROOM: 4,
}


class Blocked(enum.Enum):
    """Why nothing is admitted for the demand now, whatever the memory."""

    DRAINING = "draining"
    """Its consumer is draining: every new demand fails."""
    PAUSED = "paused"
    """Admission on its GPU is paused: demands wait for resume."""
    STALE = "stale"
    """No fresh NVML sample: a demand that must load fails SCHEDULER_STATE_STALE."""
    DRIVER_ERROR = "driver_error"
    """NVML fails: a demand that must load fails DRIVER_ERROR."""
    QUEUE_FULL = "queue_full"
    """It would have to wait for an eviction, but its consumer's queue is full."""


@attrs.frozen
class Ask:
    """What a request for one model would demand: a `Demand` whose envelope may be unknown."""

    key: ResidentKey
    gpu: int
    envelope: int | None
    priority: PriorityClass
    """The request's class: its place in the queue and whom it may evict."""
    resident_priority: PriorityClass
    """The model's class once loaded."""
    policy: ResidencyPolicy = ResidencyPolicy.KEEP_WARM
    idle_ttl: float | None = None
    reload_seconds: float = 1.0
    rewarm: bool = False
    """A model to warm again (`Demand.rewarm`)."""

    @classmethod
    def of(cls, demand: Demand) -> Ask:
        """The ask whose `demand()` is this demand (as far as an ask can say one)."""
        return cls(
            key=demand.key,
            gpu=demand.gpu,
            envelope=demand.envelope,
            priority=demand.priority,
            resident_priority=demand.resident_priority,
            policy=demand.policy,
            idle_ttl=demand.idle_ttl,
            reload_seconds=demand.reload_seconds,
            rewarm=demand.rewarm,
        )

    def demand(self) -> Demand:
        """The demand a request would make (its envelope must be known)."""
        assert self.envelope is not None
        return Demand(
            key=self.key,
            gpu=self.gpu,
            envelope=self.envelope,
            priority=self.priority,
            resident_priority=self.resident_priority,
            policy=self.policy,
            idle_ttl=self.idle_ttl,
            reload_seconds=self.reload_seconds,
            rewarm=self.rewarm,
        )


@attrs.frozen
class Assessment:
    """The verdict for one ask, with the numbers it was reached from."""

    verdict: Verdict
    needed: int
    """Bytes the demand would add to the budget: 0 for a resident, its envelope otherwise
    (0 when unknown)."""
    available: int | None
    """Bytes left for it: the GPU's schedulable minus what the tickets ahead of it keep
    back (None: no sample of its GPU)."""
    schedulable: int | None
    """The GPU's schedulable bytes (None: no sample of its GPU)."""
    plan: PlanKind | None = None
    """What the planner decided (None: it was not asked)."""
    victims: tuple[ResidentKey, ...] = ()
    """AFTER_EVICTION: the residents it would unload, in eviction order."""
    freed: int = 0
    """AFTER_EVICTION: the bytes those victims (and unloads under way) give back."""
    blocked: Blocked | None = None
    reason: str = ""


LAST = 2**62
"""A ticket id after every real one: an ask sorts after every ticket that arrived with it."""


def assess(core: GateCore, ask: Ask, now: float) -> Assessment:
    """The verdict for `ask` if it were submitted at `now`. Changes nothing."""
    scheduler = core.scheduler
    gpu = ask.gpu
    budget = core.budget(gpu)
    schedulable = None if budget is None else budget.schedulable
    operator = scheduler.operator

    def refused(blocked: Blocked, reason: str) -> Assessment:
        return Assessment(
            Verdict.NO_ROOM, 0, schedulable, schedulable, blocked=blocked, reason=reason
        )

    # The order is submit's: a drain refuses and a pause holds even a resident's request.
    if ask.key.consumer in operator.draining:
        return refused(Blocked.DRAINING, f"consumer {ask.key.consumer} is draining")
    if gpu in operator.paused:
        return refused(Blocked.PAUSED, f"admission on GPU {gpu} is paused")
    resident = core.books.reusable(ask.key)
    behind = None
    if resident is not None:
        asked = attrs.evolve(ask, envelope=ask.envelope or 0).demand()
        behind = scheduler.held_behind(asked, now, LAST, resident.key, now)
        if behind is None:
            return Assessment(
                Verdict.RESIDENT, 0, schedulable, schedulable, PlanKind.GRANT, reason="resident"
            )
    if core.fault is not None:
        return refused(Blocked.DRIVER_ERROR, f"NVML fails: {core.fault.name}")
    age = core.sample_age(gpu, now)
    if age is None or age > core.settings.stale_after:
        seen = "no NVML sample yet" if age is None else f"last NVML sample is {age:.1f}s old"
        return refused(Blocked.STALE, seen)
    if behind is not None:
        # Loaded, but the queue keeps it for an earlier request that waits to evict it; a
        # wait needs a fresh sample as any other.
        full = _queue_full(core, ask.key.consumer, gpu)
        if full is not None:
            return refused(Blocked.QUEUE_FULL, full)
        return Assessment(
            Verdict.RESIDENT,
            0,
            schedulable,
            schedulable,
            PlanKind.WAIT,
            reason=f"resident, behind {behind.demand.key} past the swap bound",
        )
    loading = [
        r
        for r in core.books.residents.same_model(gpu, ask.key.consumer, ask.key.model)
        if reusable(r.key, ask.key) and r.state is ResidentState.LOADING
    ]
    if loading:
        # It rides on the load under way and adds nothing, from a place in the queue.
        full = _queue_full(core, ask.key.consumer, gpu)
        if full is not None:
            return refused(Blocked.QUEUE_FULL, full)
        return Assessment(
            Verdict.RESIDENT, 0, schedulable, schedulable, PlanKind.WAIT, reason="loading"
        )
    if ask.envelope is None or schedulable is None:
        return Assessment(
            Verdict.UNKNOWN, 0, schedulable, schedulable, reason="no envelope known for it"
        )

    demand = ask.demand()
    deadline = now + core.settings.wait_for(demand.priority)
    left = _left_for(core, demand, now, schedulable)
    releasable = 0 if UNEXPLAINED in left.claimed else _releasable_unexplained(core, gpu)
    replaced = core.books.replaced_bytes(demand)
    decision = plan(
        demand,
        pool=left.pool + replaced,
        schedulable=left.schedulable + replaced,
        residents=left.view,
        now=now,
        deadline=deadline,
        settings=core.settings.planner,
        claimed=left.claimed,
        releasable_unexplained=releasable,
        may_evict=True,
    )
    return _verdict(core, demand, decision, left.pool, schedulable)


def _verdict(
    core: GateCore, demand: Demand, decision: Plan, available: int, schedulable: int
) -> Assessment:
    kind = decision.kind
    if kind is PlanKind.GRANT and decision.needed == 0:
        return Assessment(Verdict.RESIDENT, 0, available, schedulable, kind, reason=decision.reason)
    if kind is PlanKind.GRANT:
        return Assessment(
            Verdict.FITS, decision.needed, available, schedulable, kind, reason=decision.reason
        )
    if kind is PlanKind.EVICT:
        # It waits for its victims' unloads, from a place in the queue.
        full = _queue_full(core, demand.consumer, demand.gpu)
        if full is not None:
            return Assessment(
                Verdict.NO_ROOM,
                decision.needed,
                available,
                schedulable,
                kind,
                blocked=Blocked.QUEUE_FULL,
                reason=full,
            )
        return Assessment(
            Verdict.AFTER_EVICTION,
            decision.needed,
            available,
            schedulable,
            kind,
            victims=decision.victims,
            freed=decision.eventual,
            reason=decision.reason,
        )
    return Assessment(
        Verdict.NO_ROOM, decision.needed, available, schedulable, kind, reason=decision.reason
    )


@attrs.frozen
class _Left:
    schedulable: int
    pool: int
    claimed: frozenset[ResidentKey]
    view: ResidentView


def _left_for(core: GateCore, demand: Demand, now: float, schedulable: int) -> _Left:
    """What the queue leaves a new ticket for `demand`: the pool after the tickets ahead of
    it took their shares, and the residents they count on (as a pass over the queue with
    the ticket in its place would find them)."""
    scheduler = core.scheduler
    books = core.books
    gpu = demand.gpu
    settings = core.settings.planner
    queue = scheduler.queues.get(gpu)
    order = (1, -int(demand.priority), now, float("inf"))
    ahead = [] if not queue else [t for t in queue if t.order() < order]
    residents: list[Resident] = list(books.on_gpu(gpu))
    view = ResidentView(residents, now, settings)
    if queue is None or len(ahead) == len(queue):
        # It would sort last: submit plans it from what the last pass left, when the
        # books have not changed since.
        last = scheduler.left(gpu)
        if last is not None:
            return _Left(last[0], last[1], last[2], view)
    unexplained = core.telemetry.unexplained.get(gpu, {})
    pool = schedulable - early.withheld(gpu, unexplained, scheduler.withdrawing)
    pool -= scheduler.headroom(gpu)
    claimed: set[ResidentKey] = set()
    riding: set[ResidentKey] = set()
    credited: dict[str, int] = {}
    for ticket in ahead:
        earlier = ticket.demand
        if earlier.key in riding:
            continue
        releasable = 0 if UNEXPLAINED in claimed else _releasable_unexplained(core, gpu)
        replaced = books.replaced_bytes(earlier)
        own = early.credit(earlier, unexplained, credited)
        decision = plan(
            early.planned(earlier, own),
            pool=pool + replaced,
            schedulable=schedulable + replaced,
            residents=view,
            now=now,
            deadline=ticket.deadline,
            settings=settings,
            claimed=claimed,
            releasable_unexplained=releasable,
            may_evict=not any(key in books.unloads for key in ticket.evicting),
        )
        if decision.kind is not PlanKind.FAIL and own:
            credited[earlier.consumer] = credited.get(earlier.consumer, 0) + own
        if decision.kind is PlanKind.GRANT:
            pool -= decision.needed
            if decision.needed and earlier.loads_model and books.reusable(earlier.key) is None:
                # The pass would grant it: its model is loading from then on.
                residents = [r for r in residents if r.key != earlier.key]
                residents.append(loading_resident(earlier, decision.needed, now))
                view = ResidentView(residents, now, settings)
            continue
        if decision.kind is PlanKind.FAIL:
            if earlier.started is not None:
                pool -= max(0, decision.needed)
            continue
        claimed.update(decision.counting_on)
        if releasable and decision.kind is PlanKind.WAIT:
            claimed.add(UNEXPLAINED)
        riding.add(earlier.key)
        pool -= early.kept_back(earlier, decision)
    return _Left(schedulable, pool, frozenset(claimed), view)


def _queue_full(core: GateCore, consumer: str, gpu: int) -> str | None:
    """Why a demand of `consumer` that must wait would fail QUEUE_FULL (None: it may wait)."""
    queue = core.scheduler.queues.get(gpu)
    waiting = 0 if queue is None else queue.waiting_for(consumer)
    limit = core.settings.queue_limit.get(consumer, core.settings.default_queue_limit)
    if waiting < limit:
        return None
    return f"{consumer} already has {waiting} requests waiting"


def _releasable_unexplained(core: GateCore, gpu: int) -> int:
    """Memory of the GPU's listed consumers that their next listing will name."""
    rows = core.telemetry.unexplained.get(gpu, {})
    return sum(b for c, b in rows.items() if c in core.settings.reconcilable)
