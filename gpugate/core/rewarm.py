"""Warm again: a kept-warm model evicted for a higher class is loaded again once its memory
returns, while its time-to-live still had time left.

The book remembers each such eviction (`note`): the model, its size, its class and policy,
and when its idle time-to-live would have ended (never, for `always_warm`). When the gate
asks (`due`), a remembered model is warmed again by a demand of its own class that the
planner would grant now, or after evicting only idle residents its class may take (the
same rules as any demand of that class: `gpugate.core.capacity`'s `fits` and
`after_eviction`); never while a real demand waits on its GPU, and never preempting a job
(capacity's verdicts do not count on preemption, and the pass plans it exactly as they do).

A rewarm never stands in front of a real demand: a real demand submitted on its GPU
cancels the rewarm tickets still waiting there first (`make_way`, called by
`GateCore.submit` and `GateCore.ask`), so the real demand is planned as if the rewarm had
never been asked. A rewarm already granted is a load like any other; once loaded its
lease ends and the model is an idle resident, evicted as usual.

It forgets a model when its time-to-live passes, when an operator unloads it, or once it is
resident again (by a request or by its rewarm).
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable
from typing import Protocol

import attrs

from gpugate.core.books import Books
from gpugate.core.classes import PriorityClass, ResidencyPolicy
from gpugate.core.effects import Effect, Event, EventKind, Reject, Unload, UnloadReason
from gpugate.core.failures import Failure, FailureClass
from gpugate.core.residents import ANY_OPTIONS, ResidentKey
from gpugate.core.scheduling import Scheduler
from gpugate.core.tickets import Demand, TicketState


class RewarmCore(Protocol):
    """What of the core the book reads: its books and its scheduler's tickets."""

    books: Books
    scheduler: Scheduler


REWARM_WAIT = 60.0
"""Seconds a rewarm ticket may wait for the idle residents it evicts: it waits for nothing
else, so one still waiting then has met something the plan did not foresee."""


class RewarmOutcome(enum.Enum):
    """How a rewarm ended (the `outcome` label of `gpugate_rewarms_total`)."""

    DONE = "done"
    """The runtime loaded the model; it is an idle resident now."""
    CANCELLED = "cancelled"
    """A real demand needed the room before it was granted."""
    FAILED = "failed"
    """The core refused it, or the runtime did not load it."""


@attrs.frozen
class Evicted:
    """A kept-warm model evicted for a higher class, to be loaded again while `until` lasts."""

    key: ResidentKey
    """The model with no runner options: what a load with nothing to run loads."""
    gpu: int
    bytes: int
    priority: PriorityClass
    """The model's own class: its rewarm demands in it, and is evicted by its rules."""
    policy: ResidencyPolicy
    idle_ttl: float | None
    reload_seconds: float
    evicted_at: float
    until: float | None
    """When its idle time-to-live would have ended had it not been evicted; None: never
    (always_warm)."""
    by: PriorityClass
    """The class of the demand it was evicted for."""

    def demand(self, now: float) -> Demand:
        """Its rewarm: a demand of its own class that leaves it idle until its old expiry."""
        ttl = None if self.until is None else max(0.0, self.until - now)
        return Demand(
            key=self.key,
            gpu=self.gpu,
            envelope=self.bytes,
            priority=self.priority,
            resident_priority=self.priority,
            policy=self.policy,
            idle_ttl=ttl,
            reload_seconds=self.reload_seconds,
            max_wait=REWARM_WAIT,
            rewarm=True,
        )


def always_warm_only(key: ResidentKey, policy: ResidencyPolicy) -> bool:
    """The default choice of what is warmed again: always_warm models only."""
    return policy is ResidencyPolicy.ALWAYS_WARM


class RewarmBook:
    """What was evicted for a higher class and is to be warmed again, and the rewarms
    under way (by ticket id, which is their lease's id once granted)."""

    def __init__(self) -> None:
        self.evicted: dict[ResidentKey, Evicted] = {}
        self.under_way: dict[int, Demand] = {}
        self.wants: Callable[[ResidentKey, ResidencyPolicy], bool] = always_warm_only
        """Whether a model is warmed again: set by the gate from each model's `rewarm`
        setting and whether its runtime can load a model when asked."""

    def is_rewarm(self, ticket_id: int) -> bool:
        return ticket_id in self.under_way

    def note(self, core: RewarmCore, effects: Iterable[Effect], now: float) -> None:
        """The gate carries out `effects`: remember what is evicted for a higher class,
        forget what an operator unloads. Called before the core's next event, while the
        tickets the unloads are for are still waiting."""
        for effect in effects:
            if not isinstance(effect, Unload):
                continue
            key = ResidentKey(effect.key.consumer, effect.key.model)
            if effect.reason is UnloadReason.OPERATOR:
                self.evicted.pop(key, None)
                continue
            if effect.reason is not UnloadReason.EVICTION or effect.for_ticket is None:
                continue
            if effect.key.part is not None:
                continue  # a split model is warmed again by no single demand
            if effect.key.options not in ("", ANY_OPTIONS):
                # A load with nothing to run carries no runner options: it would load
                # another model than the one a request with these options reuses.
                continue
            ticket = core.scheduler.tickets.get(effect.for_ticket)
            resident = core.books.residents.get(effect.key)
            if ticket is None or resident is None or effect.for_ticket in self.under_way:
                continue
            if ticket.demand.priority <= resident.priority:
                continue
            if not self.wants(key, resident.policy):
                continue
            until = None
            if resident.idle_ttl is not None:
                if resident.idle_ttl <= 0:
                    continue  # load_on_demand: it would be gone by now anyway
                until = resident.last_used + resident.idle_ttl
                if until <= now:
                    continue
            self.evicted[key] = Evicted(
                key=key,
                gpu=effect.gpu,
                bytes=effect.bytes,
                priority=resident.priority,
                policy=resident.policy,
                idle_ttl=resident.idle_ttl,
                reload_seconds=resident.reload_seconds,
                evicted_at=now,
                until=until,
                by=ticket.demand.priority,
            )

    def forget_expired(self, now: float) -> None:
        """Drop the models whose time-to-live has passed."""
        for key, evicted in list(self.evicted.items()):
            if evicted.until is not None and evicted.until <= now:
                del self.evicted[key]

    def next_expiry(self) -> float | None:
        times = [e.until for e in self.evicted.values() if e.until is not None]
        return min(times) if times else None

    def make_way(self, core: RewarmCore, gpu: int, now: float) -> list[Effect]:
        """A real demand is about to be planned on `gpu`: every rewarm ticket still waiting
        there is cancelled first (its waiter is told, with a Reject), so none is ahead of it.
        The memory its evictions free goes to whoever is planned next."""
        effects: list[Effect] = []
        for ticket_id, rewarm in list(self.under_way.items()):
            key = rewarm.key
            ticket = core.scheduler.tickets.get(ticket_id)
            if ticket is None or ticket.state is not TicketState.WAITING:
                continue
            if ticket.demand.gpu != gpu:
                continue
            del self.under_way[ticket_id]
            failure = Failure(
                FailureClass.RESIDENCY_CONFLICT,
                f"RESIDENCY_CONFLICT: the rewarm of {key} gave way to a request on GPU {gpu}",
                consumer=key.consumer,
                model=key.model,
                gpu=gpu,
                bytes_needed=ticket.demand.envelope,
            )
            cancelled = core.scheduler.cancel(ticket_id, now)
            # Its own event says why, not the ticket's "its client went away".
            effects.append(Reject(ticket_id, failure))
            effects.extend(e for e in cancelled if not _ticket_cancelled(e, key))
            effects.append(
                rewarm_event(
                    EventKind.REWARM_CANCELLED,
                    now,
                    ticket.demand,
                    "a request needs the room",
                    wait=now - ticket.arrived,
                )
            )
        return effects

    def finished(
        self, core: RewarmCore, ticket_id: int, outcome: RewarmOutcome, now: float, why: str = ""
    ) -> list[Effect]:
        """The gate is done with a rewarm (its lease released, or its ticket ended): the
        event that says how. A rewarm `make_way` cancelled already has its event."""
        rewarm = self.under_way.pop(ticket_id, None)
        if rewarm is None:
            return []
        if outcome is RewarmOutcome.DONE:
            self.evicted.pop(rewarm.key, None)
        kind = {
            RewarmOutcome.DONE: EventKind.REWARM_DONE,
            RewarmOutcome.CANCELLED: EventKind.REWARM_CANCELLED,
            RewarmOutcome.FAILED: EventKind.REWARM_FAILED,
        }[outcome]
        return [rewarm_event(kind, now, rewarm, why)]


def _ticket_cancelled(effect: Effect, key: ResidentKey) -> bool:
    return (
        isinstance(effect, Event)
        and effect.kind is EventKind.TICKET_CANCELLED
        and effect.key == key
    )


def rewarm_event(
    kind: EventKind, now: float, demand: Demand, detail: str, *, wait: float | None = None
) -> Event:
    return Event(
        kind,
        now,
        key=demand.key,
        gpu=demand.gpu,
        bytes=demand.envelope,
        detail=detail,
        priority=demand.priority.label,
        wait=wait,
        reason=kind.value.removeprefix("rewarm_"),
    )
