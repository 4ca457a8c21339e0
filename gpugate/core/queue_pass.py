"""The pass over one GPU's queue: each ticket, in order, decided and then granted, failed,
or left waiting with its evictions started.

A pass hands each ticket, in class-then-arrival order, the bytes the earlier tickets left
(the pool). A ticket that must wait keeps back the part of its need that what it waits for
will not cover, and the residents it counts on; a later ticket may only use what is left
(backfill that never delays an earlier ticket). Tickets for a model another ticket is
already waiting for ride on that one.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Protocol

import attrs

from gpugate.core import early, floors, room, swaps
from gpugate.core.books import Books
from gpugate.core.crowding import held_by
from gpugate.core.effects import Effect, Grant, Reject
from gpugate.core.failures import Failure, FailureClass
from gpugate.core.job_leases import JobBook
from gpugate.core.operator import OperatorBook
from gpugate.core.passes import (
    UNEXPLAINED,
    FailureFactory,
    GpuResidents,
    Outcome,
    Tail,
    failure_event,
    granted_event,
)
from gpugate.core.planner import Plan, PlanKind, PlannerSettings, elsewhere, plan
from gpugate.core.preemption import PreemptClasses
from gpugate.core.queue import TicketQueue
from gpugate.core.telemetry import Telemetry
from gpugate.core.tickets import Demand, Lease, Sizing, Ticket, TicketState
from gpugate.core.units import format_gib
from gpugate.core.views import ResidentView, yielding


class Queues(Protocol):
    """What a pass reads and changes of its scheduler: the books and samples, the waiting
    tickets and their queues, and how a ticket leaves its queue."""

    books: Books
    telemetry: Telemetry
    planner: PlannerSettings
    tickets: dict[int, Ticket]
    queues: dict[int, TicketQueue]
    wake: dict[int, float]
    plans: dict[int, Plan]
    last_call: set[int]
    withdrawing: dict[tuple[str, int], list[Demand]]
    swaps: swaps.SwapBook
    operator: OperatorBook
    preempt: PreemptClasses | None
    jobs: JobBook | None

    def headroom(self, gpu: int) -> int: ...

    def dequeue(self, ticket: Ticket) -> None: ...

    def reject(self, ticket: Ticket, failure: Failure, now: float) -> list[Effect]: ...

    def gave_up(self, demand: Demand) -> None: ...

    def timed_out(self, ticket: Ticket, now: float, extra: str = "") -> Failure: ...

    def after_evictions(self, ticket: Ticket, tail: Tail | None = None) -> str: ...


class QueuePass:
    """Passes over the scheduler's queues (a part the `Scheduler` holds), and what the last
    one over each GPU left for a ticket that sorts last."""

    def __init__(
        self,
        scheduler: Queues,
        *,
        usable: Callable[[int, float], FailureClass | None],
        fail: FailureFactory,
        reconcilable: frozenset[str],
    ) -> None:
        self.scheduler = scheduler
        self.books = scheduler.books
        self.telemetry = scheduler.telemetry
        self._usable = usable
        self._fail = fail
        self._reconcilable = reconcilable
        self.tails: dict[int, Tail] = {}
        """Per GPU, what its last pass left (`Tail`)."""
        self.full: set[int] = set()
        """Tickets the last pass found waiting past their consumer's queue limit."""
        self._residents: dict[int, GpuResidents] = {}

    def schedule(self, gpu: int, now: float, no_wait: Iterable[int] = ()) -> list[Effect]:
        """Walk the GPU's queue in order; grant, evict for, or fail each ticket."""
        effects: list[Effect] = []
        budget = self.telemetry.budget(gpu, self.books)
        schedulable = budget.schedulable if budget else 0
        view = ResidentView(
            self._source(gpu), now, self.scheduler.planner, version=self.books.residents_version
        )
        # Jobs being withdrawn may still be running: what they may take is nobody's.
        unexplained = self.telemetry.unexplained.get(gpu, {})
        pool = schedulable - early.withheld(gpu, unexplained, self.scheduler.withdrawing)
        # What loads that size themselves, granted below their ceiling, may still take.
        pool -= self.scheduler.headroom(gpu)
        tail = Tail(self.books.stamp(gpu), schedulable, pool, set(), set(), view)
        queue = self.scheduler.queues.get(gpu)
        # While an overrun grows, what the budget says now may be gone by the next sample.
        paused = gpu in self.scheduler.operator.paused or self.telemetry.overruns.growing(gpu)
        if queue and budget is not None and not paused and self._usable(gpu, now) is None:
            no_wait = set(no_wait)
            for ticket in queue:
                if ticket.demand.key in tail.riding:
                    continue
                outcome = self.plan_one(
                    ticket, tail, now, effects, may_wait=ticket.id not in no_wait
                )
                if outcome is Outcome.FULL:
                    self.full.add(ticket.id)
        tail.version = self.books.stamp(gpu)
        self.tails[gpu] = tail
        return effects

    def decide(self, ticket: Ticket, tail: Tail, now: float, demand: Demand | None = None) -> Plan:
        """The planner's decision for one ticket (or for `demand` in its place: its floor)
        against what earlier tickets left."""
        demand = ticket.demand if demand is None else demand
        gpu = demand.gpu
        releasable = 0 if UNEXPLAINED in tail.claimed else self._releasable_unexplained(gpu)
        # What the runtime frees itself for this load is this demand's, and no one else's.
        replaced = self.books.replaced_bytes(demand)
        elsewhere = self._elsewhere(demand, now)
        if elsewhere is not None:
            return elsewhere
        own = early.credit(demand, self.telemetry.unexplained.get(gpu, {}), tail.credited)
        view, settings = self._view(tail, gpu, now), self.scheduler.planner
        if settings.equal_class_grace and swaps.held_long(ticket, now, settings):
            # Held long enough: the grace no longer keeps a model of its class from it.
            settings = swaps.ungraced(settings)
            view = ResidentView(view.source, now, settings, version=view.version)
        decision = plan(
            early.planned(demand, own),
            pool=tail.pool + replaced,
            schedulable=tail.schedulable + replaced,
            residents=view,
            now=now,
            deadline=ticket.deadline,
            settings=settings,
            claimed=tail.claimed,
            releasable_unexplained=releasable,
            may_evict=not any(key in self.books.unloads for key in ticket.evicting),
            held=held_by(self.books.residents.values(), demand),
        )
        if decision.kind is not PlanKind.GRANT or demand.sizing is not Sizing.FITS_FREE:
            return decision
        return floors.await_allocations(demand, decision, self.telemetry.budget(gpu, self.books))

    def floor(
        self, ticket: Ticket, tail: Tail, decision: Plan, now: float, reason: FailureClass
    ) -> Plan:
        """The ticket's ceiling met `decision` (`reason`): plan its floor. A floor that can
        be had becomes the ticket's demand; else the ceiling's decision stands, saying so."""
        demand = ticket.demand
        why = self._fail(reason, demand, decision.needed, now, extra=f"; {decision.reason}")
        floored = floors.at_floor(demand, reason, why.message)
        budget = self.telemetry.budget(demand.gpu, self.books)
        if reason is FailureClass.INSUFFICIENT_SCHEDULABLE_VRAM and budget is not None:
            # The most it can have now (what is free, and the residents it may evict now),
            # where that is above its floor: the runtime takes what it finds free, so the
            # lease had better say so (and its preemption frees it). Short of that, its floor.
            idle = self._view(tail, demand.gpu, now).evictable(demand)
            most = max(0, budget.schedulable) + sum(r.bytes for r in idle)
            if most > (demand.floor or 0):
                reaching = floors.at_floor(demand, reason, why.message, most)
                chance = self.decide(ticket, tail, now, reaching)
                if chance.kind in (PlanKind.GRANT, PlanKind.EVICT):
                    ticket.demand = reaching
                    return chance
        chance = self.decide(ticket, tail, now, floored)
        if chance.kind is PlanKind.FAIL or (
            reason is FailureClass.LEASE_TIMEOUT and chance.kind is not PlanKind.GRANT
        ):
            floor = format_gib(floored.degraded.floor if floored.degraded else 0)
            if (
                chance.kind is PlanKind.FAIL
                and chance.failure is FailureClass.DEADLINE_CANNOT_BE_MET
                and decision.failure is FailureClass.INSUFFICIENT_SCHEDULABLE_VRAM
            ):
                # Its floor fits later: the client is told to come back (the floor's
                # answer), not that it can never run.
                ceiling = decision.reason
                return attrs.evolve(
                    chance, reason=f"its floor of {floor}: {chance.reason}; its ceiling: {ceiling}"
                )
            return attrs.evolve(
                decision, reason=f"{decision.reason}; nor its floor of {floor}: {chance.reason}"
            )
        ticket.demand = floored
        return chance

    def _credited(self, ticket: Ticket, tail: Tail) -> int:
        """Count the ticket's early bytes as credited in this pass; returns them."""
        demand = ticket.demand
        own = early.credit(demand, self.telemetry.unexplained.get(demand.gpu, {}), tail.credited)
        if own:
            tail.credited[demand.consumer] = tail.credited.get(demand.consumer, 0) + own
        return own

    def grant(
        self, ticket: Ticket, tail: Tail, decision: Plan, now: float, effects: list[Effect]
    ) -> Lease:
        """Grant a ticket as planned."""
        demand = ticket.demand
        gpu = demand.gpu
        if ticket.id in self.scheduler.tickets:
            self.scheduler.dequeue(ticket)
        ticket.state = TicketState.GRANTED
        own = self._credited(ticket, tail)
        resident = self.books.reusable(demand.key)
        grows = demand.degraded is not None and demand.sizing is Sizing.FITS_FREE
        headroom = floors.headroom(self.books, gpu) if grows else 0
        lease = self.books.open_lease(
            ticket.id, demand, now, ticket.arrived, decision.needed, resident
        )
        if grows:
            # What it may still take is no later ticket's in this pass either.
            tail.pool -= floors.headroom(self.books, gpu) - headroom
        if own:
            # Its lease now explains what the samples showed of it.
            self.telemetry.absorb(gpu, demand.consumer, own)
        tail.pool -= decision.needed
        effects.append(Grant(ticket.id, lease))
        effects.append(granted_event(lease))
        if lease.loads:
            swap = self.scheduler.swaps.loaded(
                demand.key, gpu, now, self.scheduler.planner.swap_window
            )
            if swap is not None:
                effects.append(swap)
        if demand.degraded is not None:
            effects.append(floors.degraded_event(lease))
        tail.version = self.books.stamp(gpu)
        return lease

    def plan_one(
        self, ticket: Ticket, tail: Tail, now: float, effects: list[Effect], *, may_wait: bool
    ) -> Outcome:
        """Plan one ticket against what earlier tickets left, and apply the plan."""
        if ticket.id in self.scheduler.last_call:
            return self._last_call(ticket, tail, now, effects)
        demand = ticket.demand
        gpu = demand.gpu
        releasable = 0 if UNEXPLAINED in tail.claimed else self._releasable_unexplained(gpu)
        decision = self.decide(ticket, tail, now)
        if (
            self._elsewhere(demand, now) is None
            and decision.kind in (PlanKind.WAIT, PlanKind.FAIL)
            and self.scheduler.preempt is not None
        ):
            decision = self._preempting(ticket, tail, decision, now, effects, may_wait) or decision
        if floors.may_degrade(demand, decision):
            assert decision.failure is not None
            decision = self.floor(ticket, tail, decision, now, decision.failure)
            demand = ticket.demand
        queued = ticket.id in self.scheduler.tickets
        if decision.kind is PlanKind.GRANT and self.barred(ticket, decision, now):
            queue = self.scheduler.queues.get(gpu)
            decision = swaps.behind(ticket, now, self.books, queue, self.scheduler.planner)
        if decision.kind is PlanKind.GRANT:
            self.grant(ticket, tail, decision, now, effects)
            return Outcome.GRANTED
        if decision.kind is PlanKind.FAIL:
            assert decision.failure is not None
            retry = None
            if decision.earliest is not None:
                retry = float(max(1, math.ceil(decision.earliest - now)))
            failure = self._fail(
                decision.failure,
                demand,
                decision.needed,
                now,
                retry_after=retry,
                extra=f"; {decision.reason}{floors.at_floor_note(demand)}"
                f"{self.scheduler.after_evictions(ticket, tail)}",
            )
            if queued:
                effects.extend(self.scheduler.reject(ticket, failure, now))
            else:
                ticket.state = TicketState.FAILED
                self.scheduler.gave_up(demand)
                effects.append(Reject(ticket.id, failure))
                effects.append(failure_event(failure, now))
            if demand.started is not None:
                # Still running until its runtime drops it: the rest of the pass keeps off.
                tail.pool -= max(0, decision.needed)
            return Outcome.FAILED
        if not may_wait:
            return Outcome.FULL
        ticket.allocating = decision.reason if floors.allocating(decision) else ""
        ticket.counting_on = decision.counting_on
        ticket.reason = decision.reason + yielding(
            self.books.residents.get, decision.counting_on, demand, now, self.scheduler.planner
        )
        if decision.kind is PlanKind.EVICT:
            ticket.evicting = decision.victims
            effects.extend(
                room.start_evictions(
                    ticket,
                    decision.victims,
                    now,
                    books=self.books,
                    telemetry=self.telemetry,
                    swaps=self.scheduler.swaps,
                    settings=self.scheduler.planner,
                )
            )
        if decision.earliest is not None and decision.earliest > now:
            self.scheduler.wake[ticket.id] = decision.earliest
        else:
            self.scheduler.wake.pop(ticket.id, None)
        tail.claimed.update(decision.counting_on)
        if releasable and decision.kind is PlanKind.WAIT:
            tail.claimed.add(UNEXPLAINED)
        tail.riding.add(demand.key)
        self.scheduler.plans[ticket.id] = decision
        self._credited(ticket, tail)
        tail.pool -= early.kept_back(demand, decision)
        tail.version = self.books.stamp(gpu)
        return Outcome.WAITING

    def _last_call(self, ticket: Ticket, tail: Tail, now: float, effects: list[Effect]) -> Outcome:
        """A ticket with a floor at its deadline: its ceiling if that is free now, else its
        floor if that is, evicting nobody (an eviction would end past the deadline); else
        LEASE_TIMEOUT."""
        self.scheduler.last_call.discard(ticket.id)
        decision = self.decide(ticket, tail, now)
        if decision.kind is not PlanKind.GRANT and ticket.demand.degraded is None:
            decision = self.floor(ticket, tail, decision, now, FailureClass.LEASE_TIMEOUT)
        if decision.kind is PlanKind.GRANT:
            self.grant(ticket, tail, decision, now, effects)
            return Outcome.GRANTED
        failure = self.scheduler.timed_out(ticket, now, f"; {decision.reason}")
        effects.extend(self.scheduler.reject(ticket, failure, now))
        return Outcome.FAILED

    def barred(self, ticket: Ticket, decision: Plan, now: float) -> bool:
        """A grant from a loaded model that would go ahead of a ticket past the swap bound."""
        queue = self.scheduler.queues.get(ticket.demand.gpu)
        return swaps.barred(ticket, decision, now, self.books, queue, self.scheduler.planner)

    def _elsewhere(self, demand: Demand, now: float) -> Plan | None:
        return elsewhere(demand, self.books.residents.get(demand.key), now)

    def _view(self, tail: Tail, gpu: int, now: float) -> ResidentView:
        """The pass's resident view, rebuilt when a grant or an eviction changed the books."""
        version = self.books.residents_version
        if tail.view.now != now or tail.view.version != version:
            tail.view = ResidentView(
                self._source(gpu), now, self.scheduler.planner, version=version
            )
        return tail.view

    def _source(self, gpu: int) -> GpuResidents:
        source = self._residents.get(gpu)
        if source is None:
            source = self._residents[gpu] = GpuResidents(self.books, gpu)
        return source.current()

    def _releasable_unexplained(self, gpu: int) -> int:
        rows = self.telemetry.unexplained.get(gpu, {})
        return sum(b for c, b in rows.items() if c in self._reconcilable)

    def _preempting(
        self,
        ticket: Ticket,
        tail: Tail,
        decision: Plan,
        now: float,
        effects: list[Effect],
        may_wait: bool,
    ) -> Plan | None:
        """A ticket that cannot have its bytes otherwise waits for jobs it may stop
        (`gpugate.core.room`)."""
        jobs, classes = self.scheduler.jobs, self.scheduler.preempt
        if jobs is None or classes is None:
            return None
        return room.preempting(
            ticket,
            decision,
            now,
            effects,
            may_wait,
            jobs=jobs,
            classes=classes,
            pool=tail.pool,
            view=lambda: self._view(tail, ticket.demand.gpu, now),
            claimed=tail.claimed,
            books=self.books,
            telemetry=self.telemetry,
            settings=self.scheduler.planner,
        )
