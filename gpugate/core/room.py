"""Room made for a waiting ticket: the residents evicted for it and the jobs preempted for it."""

from __future__ import annotations

from collections.abc import Callable

from gpugate.core.books import Books
from gpugate.core.effects import Effect, Event, EventKind, Preempt, UnloadReason
from gpugate.core.job_leases import JobBook
from gpugate.core.margins import record_evictions
from gpugate.core.planner import Plan, PlanKind, PlannerSettings
from gpugate.core.preemption import PreemptClasses, choose_preemption
from gpugate.core.residents import Resident, ResidentKey
from gpugate.core.swaps import SwapBook
from gpugate.core.telemetry import Telemetry
from gpugate.core.tickets import Demand, Ticket
from gpugate.core.units import format_gib
from gpugate.core.views import ResidentView


def schedulable(telemetry: Telemetry, books: Books, gpu: int) -> int:
    """The GPU's schedulable bytes now (for the record of an eviction)."""
    budget = telemetry.budget(gpu, books)
    return 0 if budget is None else budget.schedulable


def start_evictions(
    ticket: Ticket,
    victims: tuple[ResidentKey, ...],
    now: float,
    *,
    books: Books,
    telemetry: Telemetry,
    swaps: SwapBook,
    settings: PlannerSettings,
) -> list[Effect]:
    """Unload the residents the ticket's plan evicts: the unloads, their events, and the
    record of what was evicted for it."""
    demand = ticket.demand
    gpu = demand.gpu
    effects: list[Effect] = []
    before = schedulable(telemetry, books, gpu)
    record_evictions(telemetry, books, ticket, victims, now)
    for key in victims:
        resident = books.residents[key]
        reason = UnloadReason.REPLACE if key.model == demand.model else UnloadReason.EVICTION
        effects.append(books.start_unload(resident, reason, ticket.id, now))
        if reason is UnloadReason.EVICTION:
            swaps.evicted(key, gpu, now)
        effects.append(
            Event(
                EventKind.EVICTION_STARTED,
                now,
                key=key,
                gpu=gpu,
                bytes=resident.bytes,
                reason=reason.value,
                detail=f"for {demand.key} ({demand.priority.label}); "
                f"{format_gib(before)} schedulable before{yielded(resident, demand, settings)}",
                schedulable_before=before,
            )
        )
        effects.extend(books.unload_parts(resident, reason, None, now))
    return effects


def yielded(resident: Resident, demand: Demand, settings: PlannerSettings) -> str:
    """For the record of an eviction: a higher-class resident yielded after idling."""
    if resident.priority <= demand.priority or settings.yield_after is None:
        return ""
    return (
        f"; {resident.priority.label} and idle past yield_after "
        f"({settings.yield_after:g}s) while {demand.priority.label} waited"
    )


def preempting(
    ticket: Ticket,
    decision: Plan,
    now: float,
    effects: list[Effect],
    may_wait: bool,
    *,
    jobs: JobBook,
    classes: PreemptClasses,
    pool: int,
    view: Callable[[], ResidentView],
    claimed: set[ResidentKey],
    books: Books,
    telemetry: Telemetry,
    settings: PlannerSettings,
) -> Plan | None:
    """A ticket that cannot have its bytes otherwise waits for jobs it may stop: those
    already being stopped for it, or, now, the fewest that make it fit (`pool`: what
    earlier tickets left; `view`: the pass's resident view)."""
    demand = ticket.demand
    stopping = [p for p in jobs.by_consumer.values() if p.preempted_for == ticket.id]
    if not stopping and may_wait:
        stopping = choose_preemption(
            demand,
            pool=pool,
            view=view(),
            claimed=claimed,
            job_leases=list(jobs.by_consumer.values()),
            books=books,
            classes=classes,
            now=now,
            settings=settings,
        )
        before = schedulable(telemetry, books, demand.gpu) if stopping else 0
        for job_lease in stopping:
            job_lease.preempted_for = ticket.id
            consumer = job_lease.lease.key.consumer
            names = sorted(
                job_lease.names, key=lambda name: max(job_lease.names[name]), reverse=True
            )
            effects.append(Preempt(consumer, demand.gpu, tuple(names), job_lease.bytes, ticket.id))
            effects.append(
                Event(
                    EventKind.PREEMPTION_STARTED,
                    now,
                    consumer=consumer,
                    model=job_lease.lease.key.model,
                    gpu=demand.gpu,
                    bytes=job_lease.bytes,
                    reason=demand.priority.label,
                    detail=f"jobs {', '.join(names)} of {consumer} for {demand.key} "
                    f"({demand.priority.label}); {format_gib(before)} schedulable before",
                    schedulable_before=before,
                )
            )
        if stopping:
            keys = tuple(job_lease.lease.key for job_lease in stopping)
            freed = sum(job_lease.bytes for job_lease in stopping)
            record_evictions(telemetry, books, ticket, keys, now, freed=freed)
            books.touch()
    if not stopping:
        return None
    return Plan(
        PlanKind.WAIT,
        decision.needed,
        eventual=sum(p.bytes for p in stopping),
        earliest=now,
        reason="waiting for the jobs it preempted to end",
    )
