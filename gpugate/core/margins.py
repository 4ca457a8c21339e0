"""Why a demand that had residents evicted for it cannot have its memory after all.

The planner starts evicting for a demand once it would fit against the GPU's current
budget, reserve included, and the unloads then take seconds. The margin the plan counts
on is held while they run: the queue keeps the bytes they free for the demand (no later
ticket of its class or below takes them), and the reserve it was planned with moves only
for others. The plan's own unloads are not external use (`gpugate.core.motion`), and
external use that falls raises the reserve by no more than it fell, so external use plus
the reserve stays where the plan saw it until external use grows. What the gate does not
decide can still undo a plan: external use that grows, a consumer that grows past its
lease, a demand of a higher class that arrives and takes the memory first. Then the
failure says what was evicted for the demand and which of these happened, with the
figures from when the plan began (the demo's image render was once refused after two
models had been unloaded for it, the reserve grown by the gate's own unloads).
"""

from __future__ import annotations

from collections.abc import Collection

import attrs

from gpugate.core.books import Books
from gpugate.core.budget import GpuBudget
from gpugate.core.residents import ResidentKey
from gpugate.core.telemetry import Telemetry
from gpugate.core.tickets import Margin, Ticket
from gpugate.core.units import format_gib


def record_evictions(
    telemetry: Telemetry,
    books: Books,
    ticket: Ticket,
    victims: tuple[ResidentKey, ...],
    now: float,
    *,
    freed: int | None = None,
) -> None:
    """Residents (or a job lease's jobs) are evicted for the ticket: record them against
    the figures of its first plan. `freed`: what the victims hold (default: the
    residents' bytes)."""
    gpu = ticket.demand.gpu
    budget = telemetry.budget(gpu, books)
    if budget is None:
        return
    if freed is None:
        victims = tuple(key for key in victims if key in books.residents)
        freed = sum(books.residents[key].bytes for key in victims)
    margin = ticket.margin
    if margin is None:
        ticket.margin = margin_of(budget, victims, freed, now)
    else:
        ticket.margin = attrs.evolve(
            margin, victims=margin.victims + victims, freed=margin.freed + freed
        )


def after_evictions(telemetry: Telemetry, books: Books, ticket: Ticket, *, ahead: int = 0) -> str:
    """For the failure of a ticket that had residents evicted for it: what changed since
    its plan began ("" for one that evicted nothing). `ahead`: bytes the demands ahead of
    it in the queue took or keep."""
    if ticket.margin is None:
        return ""
    unloading = [key for key in ticket.margin.victims if key in books.unloads]
    budget = telemetry.budget(ticket.demand.gpu, books)
    return since(ticket.margin, budget, ahead=ahead, unloading=unloading)


def margin_of(
    budget: GpuBudget, victims: tuple[ResidentKey, ...], freed: int, now: float
) -> Margin:
    """The figures an eviction plan is made against, to tell later what changed."""
    return Margin(
        at=now,
        victims=victims,
        freed=freed,
        reserve=budget.reserve,
        external=budget.external_total,
        committed=budget.committed_total,
        schedulable=budget.schedulable,
    )


def since(
    margin: Margin,
    budget: GpuBudget | None,
    *,
    ahead: int = 0,
    unloading: Collection[ResidentKey] = (),
) -> str:
    """Why a demand that had residents evicted for it cannot have its memory after all:
    what changed since the plan began. `ahead`: bytes demands ahead of it in the queue took
    or keep; `unloading`: its victims whose unload has not finished."""
    names = ", ".join(str(key) for key in margin.victims)
    head = f"; after evicting {names} ({format_gib(margin.freed)}) for it"
    if budget is None:
        return f"{head}: the GPU has no current sample"
    reasons = []
    grew = budget.external_total - margin.external
    if grew > 0:
        reasons.append(
            f"external use grew by {format_gib(grew)} ({format_gib(margin.external)} → "
            f"{format_gib(budget.external_total)})"
        )
    raised = budget.reserve - margin.reserve
    if raised > 0:
        reasons.append(f"the reserve grew by {format_gib(raised)}")
    if unloading:
        reasons.append(f"{len(unloading)} of its evictions are still under way")
    else:
        grown = budget.committed_total - (margin.committed - margin.freed)
        if grown > 0:
            reasons.append(
                f"the consumers' memory grew by {format_gib(grown)} besides what was "
                "evicted (leases granted since, or use beyond their leases)"
            )
    if ahead > 0:
        reasons.append(f"{format_gib(ahead)} went to demands ahead of it in the queue")
    if not reasons:
        reasons.append("nothing the gate sees changed")
    return (
        f"{head}: {'; '.join(reasons)} (schedulable {format_gib(margin.schedulable)} when "
        f"the plan began, {format_gib(budget.schedulable)} now)"
    )
