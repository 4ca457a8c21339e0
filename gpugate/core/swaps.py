"""Fewer swaps: who may be served from a loaded model ahead of a demand that would evict
it, within a bound on unfairness, and which reloads were swaps.

Within one class the queue serves in arrival order, with one exception: a demand for a
model that is loaded is served from it at once (0 bytes), even while an earlier demand of
its class waits to evict that model. Each such grant **overtakes** the earlier demand. The
bound: a demand is overtaken only while it has waited less than `swap_hold` seconds and
been overtaken fewer than `swap_overtakes` times (`swap_hold`, or half its maximum wait if
that is shorter). Past either, nothing of its class or below that arrived after it is
served from the models it waits for until it is served (or gives up), and the equal-class
grace no longer keeps those models from it: it waits only for the requests already in
flight on them, so at most `swap_hold` seconds plus those requests longer than
first-come-first-served would make it. `swap_overtakes: 0` is first-come-first-served. A
higher class is never held back: it is served first anyway.

A **swap** is an eviction for a demand followed, within `swap_window` seconds, by a load of
the same model on the same GPU: memory moved out and back for nothing but the order of
requests. The core says so in a `swap` event (`gpugate_swaps_total`).

Pure: no clock (the moment is passed in).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable

import attrs

from gpugate.core.books import Books
from gpugate.core.effects import Event, EventKind
from gpugate.core.planner import Plan, PlanKind
from gpugate.core.residents import ResidentKey
from gpugate.core.tickets import Demand, Ticket, TicketState
from gpugate.core.views import PlannerSettings


def fifo_order(demand: Demand, arrived: float, ticket_id: int) -> tuple[int, int, float, int]:
    """The queue's order of a demand that arrived at `arrived` (`Ticket.order`)."""
    return (int(demand.started is None), -int(demand.priority), arrived, ticket_id)


def overtaken(
    queue: Iterable[Ticket],
    demand: Demand,
    arrived: float,
    ticket_id: int,
    resident: ResidentKey,
) -> list[Ticket]:
    """The waiting tickets a grant of `resident` to `demand` goes ahead of: earlier in the
    queue's order, for another model, with `resident` among what they wait for."""
    mine = fifo_order(demand, arrived, ticket_id)
    model = (demand.consumer, demand.model)
    return [
        ticket
        for ticket in queue
        if ticket.state is TicketState.WAITING
        and ticket.id != ticket_id
        and ticket.order() < mine
        and (ticket.demand.consumer, ticket.demand.model) != model
        and resident in ticket.counting_on
    ]


def hold(ticket: Ticket, settings: PlannerSettings) -> float:
    """How long the ticket may be overtaken: `swap_hold`, or half its maximum wait when
    that is shorter (a short deadline is not spent behind other models' requests)."""
    return min(settings.swap_hold, (ticket.deadline - ticket.arrived) / 2)


def closed(ticket: Ticket, now: float, settings: PlannerSettings) -> bool:
    """Whether the ticket is past the bound: nobody may overtake it any more, and the
    equal-class grace no longer keeps a model from it."""
    return ticket.overtaken >= settings.swap_overtakes or now - ticket.arrived >= hold(
        ticket, settings
    )


def held_long(ticket: Ticket, now: float, settings: PlannerSettings) -> bool:
    """Past the bound by its wait, or by overtakes it was dealt (not merely because the
    bound is 0): the equal-class grace no longer keeps a model from it."""
    dealt = ticket.overtaken >= max(1, settings.swap_overtakes)
    return dealt or now - ticket.arrived >= hold(ticket, settings)


def ungraced(settings: PlannerSettings) -> PlannerSettings:
    """The planner's settings for a ticket past the bound: no equal-class grace."""
    return attrs.evolve(settings, equal_class_grace=0.0)


def barred_by(tickets: Iterable[Ticket], now: float, settings: PlannerSettings) -> Ticket | None:
    """The first of `tickets` past the bound (the grant must wait behind it); None: the grant
    may go ahead of all of them."""
    return next((ticket for ticket in tickets if closed(ticket, now, settings)), None)


def overtake(tickets: Iterable[Ticket]) -> None:
    """Count a grant that went ahead of each of `tickets`."""
    for ticket in tickets:
        ticket.overtaken += 1


def may_reuse(
    queue: Collection[Ticket] | None,
    demand: Demand,
    arrived: float,
    ticket_id: int,
    resident: ResidentKey,
    now: float,
    settings: PlannerSettings,
) -> bool:
    """Whether `demand` may be served from the loaded `resident` now: yes, counting an
    overtake of each earlier ticket in its GPU's `queue` that waits to evict it, unless one
    of those is past the bound."""
    if not queue:
        return True
    ahead = overtaken(queue, demand, arrived, ticket_id, resident)
    if barred_by(ahead, now, settings) is not None:
        return False
    overtake(ahead)
    return True


def held_behind(
    queue: Collection[Ticket] | None,
    demand: Demand,
    arrived: float,
    ticket_id: int,
    resident: ResidentKey,
    now: float,
    settings: PlannerSettings,
) -> Ticket | None:
    """The earlier ticket past the bound that keeps `demand` from being served from the
    loaded `resident` now (None: it may be). Read-only."""
    if not queue:
        return None
    ahead = overtaken(queue, demand, arrived, ticket_id, resident)
    return barred_by(ahead, now, settings)


def barred(
    ticket: Ticket,
    decision: Plan,
    now: float,
    books: Books,
    queue: Collection[Ticket] | None,
    settings: PlannerSettings,
) -> bool:
    """A grant from a loaded model that would go ahead of a ticket past the bound."""
    if decision.needed or decision.kind is not PlanKind.GRANT:
        return False
    resident = books.reusable(ticket.demand.key)
    if resident is None or resident.gpu != ticket.demand.gpu:
        return False
    demand = ticket.demand
    return not may_reuse(queue, demand, ticket.arrived, ticket.id, resident.key, now, settings)


def behind(
    ticket: Ticket,
    now: float,
    books: Books,
    queue: Collection[Ticket] | None,
    settings: PlannerSettings,
) -> Plan:
    """The wait of a ticket whose model is loaded but must not go ahead of an earlier
    ticket past the bound, which waits to evict it."""
    resident = books.reusable(ticket.demand.key)
    assert resident is not None
    first = held_behind(
        queue, ticket.demand, ticket.arrived, ticket.id, resident.key, now, settings
    )
    who = "" if first is None else f" {first.demand.key}"
    return Plan(
        PlanKind.WAIT,
        0,
        counting_on=(resident.key,),
        earliest=now,
        reason=f"{resident.key} is loaded, but an earlier request{who} waits to evict it "
        "and has been overtaken as much as the queue allows (swap_hold, swap_overtakes)",
    )


class SwapBook:
    """Recent evictions for a demand, by GPU and model, to tell a reload that is a swap."""

    def __init__(self) -> None:
        self._evicted: dict[tuple[int, str, str], float] = {}

    def evicted(self, key: ResidentKey, gpu: int, now: float) -> None:
        """The gate started to evict `key` on `gpu` for a waiting demand."""
        self._evicted[(gpu, key.consumer, key.model)] = now

    def loaded(self, key: ResidentKey, gpu: int, now: float, window: float) -> Event | None:
        """A lease loads `key` on `gpu`: a `swap` event when the same model was evicted there
        within `window` seconds, else None."""
        self._forget(now, window)
        at = self._evicted.pop((gpu, key.consumer, key.model), None)
        if at is None:
            return None
        return Event(
            EventKind.SWAP,
            now,
            key=key,
            gpu=gpu,
            wait=now - at,
            detail=f"{key} loaded again {now - at:.1f}s after it was evicted on GPU {gpu}",
        )

    def _forget(self, now: float, window: float) -> None:
        stale = [k for k, at in self._evicted.items() if now - at > window]
        for k in stale:
            del self._evicted[k]
