"""Pressure relief: give idle memory back when external use, or the consumers' own use
beyond their leases, ate into the reserve."""

from __future__ import annotations

import attrs

from gpugate.core.books import Books
from gpugate.core.budget import GpuBudget
from gpugate.core.classes import ResidencyPolicy
from gpugate.core.effects import Effect, Event, EventKind, UnloadReason
from gpugate.core.explain import describe_pressure
from gpugate.core.failures import Failure, FailureClass
from gpugate.core.listing import resident_event
from gpugate.core.planner import victim_order
from gpugate.core.telemetry import Telemetry


def pressure_class(budget: GpuBudget, books: Books, gpu: int) -> FailureClass:
    """Whom to blame: external use, unless the consumers' own use beyond their leases (their
    unexplained memory, models found loaded without a lease) covers the over-commit."""
    own = sum(row.unexplained for row in budget.consumers) + sum(
        r.bytes for r in books.on_gpu(gpu) if r.out_of_band
    )
    if own >= -budget.schedulable or not budget.external_total:
        return FailureClass.UNLEASED_GPU_USE
    return FailureClass.EXTERNAL_GPU_PRESSURE


def relieve_pressure(
    books: Books, telemetry: Telemetry, gpu: int, now: float, *, settling: int = 0
) -> list[Effect]:
    """Give idle memory back when external use ate into the reserve. `settling`: bytes of
    the over-commit that something under way settles without an eviction (a started job's
    grant or withdrawal, `gpugate.core.early`), as unloads under way do."""
    budget = telemetry.budget(gpu, books)
    if budget is None:
        return []
    gauge = telemetry.gauge(gpu)
    change = gauge.update(budget.schedulable)
    effects: list[Effect] = []
    cause = describe_pressure(budget, books.on_gpu(gpu)) if gauge.active else ""
    if change is True:
        cls = pressure_class(budget, books, gpu)
        effects.append(
            Event(
                EventKind.PRESSURE_ENTERED,
                now,
                gpu=gpu,
                bytes=-budget.schedulable,
                detail=f"over-committed by {-budget.schedulable} bytes",
                failure=Failure(
                    cls,
                    f"{cls.value}: GPU {gpu} is over-committed by "
                    f"{-budget.schedulable / 2**30:.1f} GiB "
                    f"({cause}); giving back idle memory",
                    gpu=gpu,
                    bytes_schedulable=0,
                ),
            )
        )
    elif change is False:
        effects.append(Event(EventKind.PRESSURE_CLEARED, now, gpu=gpu, bytes=budget.schedulable))
    if not gauge.active:
        return effects
    unloading = sum(u.bytes for u in books.unloads.values() if u.gpu == gpu)
    deficit = -budget.schedulable - unloading - settling
    victims = sorted(
        (
            r
            for r in books.on_gpu(gpu)
            if r.idle and r.policy is not ResidencyPolicy.ALWAYS_WARM and r.bytes > 0
        ),
        key=victim_order,
    )
    for resident in victims:
        if deficit <= 0:
            break
        effects.append(books.start_unload(resident, UnloadReason.PRESSURE, None, now))
        started = resident_event(
            EventKind.EVICTION_STARTED,
            now,
            resident,
            f"GPU {gpu} over-committed by {-budget.schedulable / 2**30:.1f} GiB: {cause}",
            reason=UnloadReason.PRESSURE.value,
        )
        effects.append(attrs.evolve(started, schedulable_before=budget.schedulable))
        effects.extend(books.unload_parts(resident, UnloadReason.PRESSURE, None, now))
        deficit -= resident.bytes
    return effects
