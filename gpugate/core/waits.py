"""What each waiting demand waits for: the queue as people and routers see it.

A ticket waits for one thing at a time, and this says which, from the scheduler's own
last decision for it (`Scheduler.plans`) and the books as they are now:

* `PAUSED`: an operator paused admission on its GPU (it waits for resume);
* `SAMPLE`: no decision on the numbers there are: an overrun is growing or the GPU has no
  fresh NVML sample (it waits for the next one);
* `SAME_MODEL`: its model is loading, or another ticket ahead of it loads it: one load
  serves both;
* `UNLOAD`: unloads under way (its own evictions, or its model being unloaded before it
  loads again);
* `LOADING`: it sizes itself to the free memory and another lease on its card has not
  allocated its bytes yet (`gpugate.core.floors`);
* `PREEMPTION`: jobs it preempted have not ended yet;
* `HEAD_OF_LINE`: tickets ahead of it are served first: it would fit now but for them, or
  what would free its memory goes first to one of them;
* `HOLDER_GRACE`: a holder it may have, but not yet: one of its own class until that has
  been idle the equal-class grace, or one of a higher class kept warm until its idle ttl;
* `HOLDER_BUSY`: a holder it may have once it is idle, serving requests now;
* `BYTES`: the bytes are short and no one holder is what it waits for (memory nothing
  explains yet, a lease with no known end): the line says who holds the rest;
* `TURN`: nothing holds it back any more: the next pass grants it.

Every wait says how many bytes it is short after what could be evicted for it now (0 for
a wait that is not about bytes). Pure: time is an argument.
"""

from __future__ import annotations

import enum

import attrs

from gpugate.core import floors
from gpugate.core.budget import GpuBudget
from gpugate.core.classes import PriorityClass
from gpugate.core.explain import describe_holder, describe_holders
from gpugate.core.planner import Plan, on_another_card, reusable
from gpugate.core.residents import Resident, ResidentKey, ResidentState
from gpugate.core.state import GateCore
from gpugate.core.tickets import Demand, Ticket
from gpugate.core.units import format_duration, format_gib
from gpugate.core.views import ResidentView, class_allows, release_time

__all__ = ["Hold", "Wait", "WaitReason", "Waiting", "queue_view"]


class WaitReason(enum.Enum):
    """What a waiting demand waits for (the module's docstring says each)."""

    PAUSED = "paused"
    SAMPLE = "sample"
    SAME_MODEL = "same_model"
    UNLOAD = "unload"
    LOADING = "loading"
    PREEMPTION = "preemption"
    HEAD_OF_LINE = "head_of_line"
    HOLDER_GRACE = "holder_grace"
    HOLDER_BUSY = "holder_busy"
    BYTES = "bytes"
    TURN = "turn"


class Hold(enum.Enum):
    """Why a holder's memory is not a `HOLDER_GRACE` wait's yet."""

    GRACE = "grace"
    """Of the demand's own class: evictable once idle the equal-class grace."""
    KEEP_WARM = "keep_warm"
    """Of a higher class (or always_warm): it goes at its idle ttl."""


@attrs.frozen
class Wait:
    """What one ticket waits for."""

    reason: WaitReason
    line: str
    """The same, in one line for a person."""
    short: int = 0
    """Bytes short after what is schedulable and what could be evicted for it now."""
    holder: ResidentKey | None = None
    """HOLDER_GRACE, HOLDER_BUSY, SAME_MODEL: the resident it waits for."""
    hold: Hold | None = None
    until: float | None = None
    """When what it waits for ends, as far as is known (the core's clock)."""
    behind: int | None = None
    """HEAD_OF_LINE, SAME_MODEL: the ticket ahead of it it waits behind."""
    unloading: tuple[ResidentKey, ...] = ()
    """UNLOAD: the residents whose unload it waits for."""


@attrs.frozen
class Waiting:
    """A waiting demand, its place in its GPU's queue and what it waits for."""

    ticket: int
    demand: Demand
    position: int
    """0 is the head of its GPU's queue."""
    arrived: float
    deadline: float
    wait: Wait

    @property
    def consumer(self) -> str:
        return self.demand.consumer

    @property
    def model(self) -> str:
        return self.demand.model

    @property
    def gpu(self) -> int:
        return self.demand.gpu

    @property
    def priority(self) -> PriorityClass:
        return self.demand.priority


def queue_view(core: GateCore, now: float, gpu: int | None = None) -> tuple[Waiting, ...]:
    """Every waiting demand (on `gpu`, or on every GPU) in its queue's order, with what it
    waits for. Changes nothing."""
    gpus = sorted(core.scheduler.queues) if gpu is None else [gpu]
    return tuple(row for index in gpus for row in _gpu_view(core, index, now))


def _gpu_view(core: GateCore, gpu: int, now: float) -> list[Waiting]:
    queue = core.scheduler.queues.get(gpu)
    if not queue:
        return []
    tickets = list(queue)
    budget = core.budget(gpu)
    view = ResidentView(core.books.on_gpu(gpu), now, core.settings.planner)
    first: dict[ResidentKey, Ticket] = {}
    rows = []
    for position, ticket in enumerate(tickets):
        loads = first.setdefault(ticket.demand.key, ticket)
        riding = None if loads is ticket else loads
        wait = _wait(core, ticket, riding, tickets[:position], budget, view, now)
        rows.append(
            Waiting(ticket.id, ticket.demand, position, ticket.arrived, ticket.deadline, wait)
        )
    return rows


def shortfall(demand: Demand, needed: int, budget: GpuBudget | None, view: ResidentView) -> int:
    """Bytes the demand is short after what is schedulable and what it could evict now."""
    if budget is None:
        return needed
    evictable = sum(r.bytes for r in view.evictable(demand) if r.key != demand.key)
    return max(0, needed - max(0, budget.schedulable) - evictable)


def _wait(
    core: GateCore,
    ticket: Ticket,
    riding: Ticket | None,
    ahead: list[Ticket],
    budget: GpuBudget | None,
    view: ResidentView,
    now: float,
) -> Wait:
    demand = ticket.demand
    gpu = demand.gpu
    scheduler = core.scheduler
    if gpu in scheduler.operator.paused:
        mark = scheduler.operator.marks.get(gpu)
        by = "" if mark is None else f" by {mark.by} {format_duration(now - mark.since)} ago"
        return Wait(WaitReason.PAUSED, f"admission on GPU {gpu} was paused{by}: waits for resume")
    age = core.sample_age(gpu, now)
    if core.fault is not None or age is None or age > core.settings.stale_after:
        seen = "no NVML sample" if age is None else f"the last NVML sample is {age:.1f}s old"
        if core.fault is not None:
            seen = f"NVML fails ({core.fault.name})"
        return Wait(WaitReason.SAMPLE, f"{seen}: waits for a fresh one")
    if core.telemetry.overruns.growing(gpu):
        return Wait(
            WaitReason.SAMPLE, f"an overrun on GPU {gpu} is growing: waits for the next sample"
        )
    if riding is not None:
        return Wait(
            WaitReason.SAME_MODEL,
            f"rides on ticket {riding.id} ahead of it for the same model: one load serves both",
            holder=demand.key,
            behind=riding.id,
        )
    plan = scheduler.plans.get(ticket.id)
    needed = demand.envelope if plan is None else plan.needed
    short = shortfall(demand, needed, budget, view)
    evictions = tuple(k for k in ticket.evicting if k in core.books.unloads)
    if evictions:
        return _unloads(core, evictions, short, "its evictions are under way")
    if plan is None:
        return Wait(WaitReason.TURN, "not planned yet: the next pass plans it", short=short)
    preempted = [
        p for p in core.jobs.by_consumer.values() if p.preempted_for == ticket.id and p.names
    ]
    if preempted:
        names = ", ".join(sorted({p.lease.key.consumer for p in preempted}))
        return Wait(
            WaitReason.PREEMPTION,
            f"the jobs of {names} it preempted have not ended yet",
            short=short,
        )
    if floors.allocating(plan):
        return Wait(WaitReason.LOADING, plan.reason, short=short)
    copy = on_another_card(demand, core.books.residents.get(demand.key))
    if copy is not None:
        # What `planner.elsewhere` waits for.
        if copy.state is ResidentState.LOADING:
            return Wait(
                WaitReason.SAME_MODEL,
                f"its model {copy.key} is loading on GPU {copy.gpu}: it is served once loaded",
                holder=copy.key,
            )
        if copy.state is ResidentState.UNLOADING:
            why = f"its model is unloading from GPU {copy.gpu}, to load again after"
            return _unloads(core, (copy.key,), short, why)
    exact = [r for r in view.same_model(demand.key) if reusable(r.key, demand.key)]
    for resident in exact:
        if resident.state is ResidentState.LOADING:
            return Wait(
                WaitReason.SAME_MODEL,
                f"its model {resident.key} is loading: it is served once loaded",
                holder=resident.key,
            )
    if any(r.state is ResidentState.UNLOADING for r in exact):
        keys = tuple(r.key for r in exact if r.state is ResidentState.UNLOADING)
        return _unloads(core, keys, short, "its model is unloading, to load again after")
    counted = [core.books.residents[k] for k in plan.counting_on if k in core.books.residents]
    unloading = tuple(r.key for r in counted if r.state is ResidentState.UNLOADING)
    if unloading and not [r for r in counted if r.state is ResidentState.RESIDENT]:
        return _unloads(core, unloading, short, "unloads under way free its memory")
    if short == 0 and ahead:
        return _head_of_line(demand, ahead, budget)
    holder = _holder(core, demand, plan, counted, now)
    if holder is not None:
        return _holding(core, demand, holder, short, now)
    if unloading:
        return _unloads(core, unloading, short, "unloads under way free its memory")
    taken = _taken_ahead(core, demand, ahead, now)
    if taken is not None:
        head, key = taken
        first = head.demand
        return Wait(
            WaitReason.HEAD_OF_LINE,
            f"{format_gib(short)} short; what {key} frees goes first to ticket {head.id} ahead "
            f"of it ({first.key}, {first.priority.label}, {format_gib(first.envelope)})",
            short=short,
            holder=key,
            behind=head.id,
        )
    if short == 0:
        return Wait(WaitReason.TURN, "nothing holds it back now: the next pass grants it")
    residents = list(view.source.all())
    return Wait(
        WaitReason.BYTES,
        f"{format_gib(short)} short of {format_gib(needed)}: {describe_holders(demand, residents)}",
        short=short,
    )


def _unloads(core: GateCore, keys: tuple[ResidentKey, ...], short: int, why: str) -> Wait:
    residents = [core.books.residents[k] for k in keys if k in core.books.residents]
    names = ", ".join(f"{r.key} {format_gib(r.bytes)}" for r in residents)
    return Wait(WaitReason.UNLOAD, f"{why}: {names}", short=short, unloading=keys)


def _head_of_line(demand: Demand, ahead: list[Ticket], budget: GpuBudget | None) -> Wait:
    """It would fit now but for the tickets ahead: it waits behind the first of them."""
    head = next((t for t in ahead if t.demand.key != demand.key), ahead[0])
    schedulable = 0 if budget is None else max(0, budget.schedulable)
    first = head.demand
    return Wait(
        WaitReason.HEAD_OF_LINE,
        f"it would fit now ({format_gib(schedulable)} schedulable), but {len(ahead)} "
        f"ticket(s) ahead of it go first, the first {head.id} ({first.key}, "
        f"{first.priority.label}, {format_gib(first.envelope)})",
        behind=head.id,
    )


def _taken_ahead(
    core: GateCore, demand: Demand, ahead: list[Ticket], now: float
) -> tuple[Ticket, ResidentKey] | None:
    """The first ticket ahead that counts on a resident whose memory could be this
    demand's too (it is that ticket's first), and that resident."""
    settings = core.settings.planner
    for ticket in ahead:
        plan = core.scheduler.plans.get(ticket.id)
        if plan is None:
            continue
        for key in plan.counting_on:
            resident = core.books.residents.get(key)
            if (
                resident is not None
                and key.model != demand.model
                and release_time(resident, demand, now, settings) is not None
            ):
                return ticket, key
    return None


def _holder(
    core: GateCore, demand: Demand, plan: Plan, counted: list[Resident], now: float
) -> Resident | None:
    """The resident whose memory the wait ends with: of those the plan counts on, the one
    released last by the time it expects to fit."""
    settings = core.settings.planner
    times = [
        (when, resident)
        for resident in counted
        if resident.state is ResidentState.RESIDENT
        and (when := release_time(resident, demand, now, settings)) is not None
    ]
    if not times:
        return None
    by = plan.earliest
    within = [row for row in times if by is None or row[0] <= by] or times
    return max(within, key=lambda row: row[0])[1]


def _holding(core: GateCore, demand: Demand, holder: Resident, short: int, now: float) -> Wait:
    described = describe_holder(holder, demand)
    head = f"{format_gib(short)} short; " if short else ""
    if not holder.idle:
        return Wait(
            WaitReason.HOLDER_BUSY,
            f"{head}waits for {described} to be idle",
            short=short,
            holder=holder.key,
        )
    if class_allows(holder, demand):
        if holder.priority != demand.priority:
            return Wait(
                WaitReason.TURN,
                f"{described} may be evicted now: the next pass does",
                short=short,
                holder=holder.key,
            )
        grace = core.settings.planner.equal_class_grace
        until = holder.last_used + grace
        if until <= now:
            return Wait(
                WaitReason.TURN,
                f"{described} has been idle its grace: the next pass evicts it",
                short=short,
                holder=holder.key,
            )
        return Wait(
            WaitReason.HOLDER_GRACE,
            f"{head}waits for {described}: idle {format_duration(now - holder.last_used)} of "
            f"the {format_duration(grace)} equal-class grace, evictable in "
            f"{format_duration(max(0.0, until - now))}",
            short=short,
            holder=holder.key,
            hold=Hold.GRACE,
            until=until,
        )
    until = holder.expires_at()
    if until is not None and until <= now:
        return Wait(
            WaitReason.TURN,
            f"{described} has outlived its idle ttl: it is unloaded next",
            short=short,
            holder=holder.key,
        )
    when = "" if until is None else f", in {format_duration(until - now)}"
    return Wait(
        WaitReason.HOLDER_GRACE,
        f"{head}waits for {described} to be unloaded at its idle ttl{when}",
        short=short,
        holder=holder.key,
        hold=Hold.KEEP_WARM,
        until=until,
    )
