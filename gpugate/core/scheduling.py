"""Queueing: admit a demand, walk each GPU's queue in order, grant, evict for, or fail.

A pass over a GPU's queue hands each ticket, in class-then-arrival order, the bytes the
earlier tickets left (the pool). A ticket that must wait keeps back the part of its need
that what it waits for will not cover, and the residents it counts on; a later ticket
may only use what is left (backfill that never delays an earlier ticket). Tickets for a
model another ticket is already waiting for ride on that one.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable

import attrs

from gpugate.core import early, floors
from gpugate.core.books import Books
from gpugate.core.crowding import held_by
from gpugate.core.effects import Effect, Event, EventKind, Grant, Preempt, Reject, UnloadReason
from gpugate.core.failures import Failure, FailureClass
from gpugate.core.margins import after_evictions, record_evictions
from gpugate.core.operator import OperatorBook
from gpugate.core.passes import (
    UNEXPLAINED,
    Admission,
    FailureFactory,
    GpuResidents,
    Outcome,
    Tail,
    failure_event,
    granted_event,
)
from gpugate.core.planner import Plan, PlanKind, PlannerSettings, plan
from gpugate.core.preemption import PreemptClasses, choose_preemption
from gpugate.core.queue import TicketQueue
from gpugate.core.residents import ResidentKey, ResidentState
from gpugate.core.scopes import JobBook
from gpugate.core.telemetry import Telemetry
from gpugate.core.tickets import Demand, Lease, Sizing, Ticket, TicketState
from gpugate.core.units import format_gib
from gpugate.core.views import ResidentView

__all__ = ["UNEXPLAINED", "Admission", "Scheduler", "failure_event", "granted_event"]

DRAINING_RETRY_AFTER = 30.0
"""Retry-After for a draining consumer's demand: a drain is maintenance, not a blip."""


class Scheduler:
    """Tickets and per-GPU queues. Reads the books and telemetry; changes only the books'
    leases and unloads, and its own tickets."""

    def __init__(
        self,
        books: Books,
        telemetry: Telemetry,
        *,
        planner: PlannerSettings,
        max_wait: Callable[[Demand], float],
        queue_limit: Callable[[str], int],
        reconcilable: frozenset[str],
        usable: Callable[[int, float], FailureClass | None],
        fail: FailureFactory,
    ) -> None:
        self.books = books
        self.telemetry = telemetry
        self.planner = planner
        self._max_wait = max_wait
        self._queue_limit = queue_limit
        self._reconcilable = reconcilable
        self._usable = usable
        self._fail = fail
        self.tickets: dict[int, Ticket] = {}
        self.queues: dict[int, TicketQueue] = {}
        self.wake: dict[int, float] = {}
        self._tails: dict[int, Tail] = {}
        self._full: set[int] = set()
        self._residents: dict[int, GpuResidents] = {}
        self.preempt: PreemptClasses | None = None
        self.jobs: JobBook | None = None
        """The consumers' job leases (set by the core that owns the scheduler)."""
        self.operator = OperatorBook()
        """Draining consumers and paused GPUs (gpugate.core.operator)."""
        """Which classes may stop which consumer's jobs (None: no job is ever stopped)."""
        self.after_loads = floors.AfterLoads()
        """Self-sizing loads at their floor that completed, until a sample shows them."""
        self.last_call: set[int] = set()
        """Tickets with a floor past their deadline: their next pass grants their ceiling or
        their floor from what is free, or fails them (`gpugate.core.floors`)."""
        self.withdrawing: dict[tuple[str, int], list[Demand]] = {}
        """(consumer, GPU) → demands of started jobs that ended without a grant, until the
        gate says their runtime dropped them (`GateCore.withdrawn`)."""

    # -- demands -------------------------------------------------------------------------

    def new_id(self) -> int:
        """A ticket id (it becomes the lease's id) for a demand about to be submitted."""
        return self.books.new_id()

    def submit(
        self,
        demand: Demand,
        now: float,
        *,
        ticket_id: int | None = None,
        at_once: bool = False,
    ) -> Admission:
        """A request needs VRAM: grant it, queue it, or fail it. `at_once`: grant it only
        from memory no waiting ticket keeps back, evicting nobody; otherwise it is
        `deferred` (a draining consumer's or an unusable GPU's demand still fails)."""
        ticket_id = self.books.new_id() if ticket_id is None else ticket_id
        gpu = demand.gpu
        draining = self.refuse_draining(demand, ticket_id, now)
        if draining is not None:
            return draining
        if gpu in self.operator.paused:
            if at_once:
                return Admission(ticket_id, deferred=True)
            return self._hold(demand, ticket_id, now)
        resident = self.books.reusable(demand.key)
        if resident is not None:
            lease = self.books.open_lease(ticket_id, demand, now, now, 0, resident)
            return Admission(ticket_id, lease=lease, effects=(granted_event(lease),))
        if self.telemetry.overruns.growing(gpu) and self._usable(gpu, now) is None:
            # The memory an overrun takes may still be going: nothing new on old numbers.
            if at_once:
                return Admission(ticket_id, deferred=True)
            return self._hold(demand, ticket_id, now, why=f"an overrun on GPU {gpu} is growing")
        unusable = self._usable(gpu, now)
        if unusable is not None:
            self.gave_up(demand)
            failure = self._fail(unusable, demand, demand.envelope, now)
            return Admission(ticket_id, failure=failure, effects=(failure_event(failure, now),))
        queue = self.queues.setdefault(gpu, TicketQueue())
        wait = self._max_wait(demand) if demand.max_wait is None else demand.max_wait
        ticket = Ticket(ticket_id, demand, arrived=now, deadline=now + wait)
        if at_once:
            return self._at_once(ticket, now)
        may_wait = queue.waiting_for(demand.consumer) < self._queue_limit(demand.consumer)
        effects: list[Effect] = []
        if queue.would_be_last(ticket):
            # Earlier tickets' plans do not depend on a later one: plan it from the tail.
            tail = self._tails.get(gpu)
            if tail is None or tail.version != self.books.stamp(gpu):
                effects.extend(self.schedule(gpu, now))
                tail = self._tails[gpu]
            outcome = self._plan_one(ticket, tail, now, effects, may_wait=may_wait)
            if outcome is Outcome.WAITING:
                self._enqueue(ticket)
                tail.version = self.books.stamp(gpu)
        else:
            self._enqueue(ticket)
            effects.extend(self.schedule(gpu, now, no_wait=() if may_wait else (ticket_id,)))
            outcome = Outcome.WAITING if ticket.state is TicketState.WAITING else Outcome.GRANTED
            if ticket_id in self._full:
                self._full.discard(ticket_id)
                self._dequeue(ticket)
                effects.extend(self.schedule(gpu, now))
                outcome = Outcome.FULL
        if outcome is Outcome.FULL:
            self.gave_up(demand)
            failure = self._fail(
                FailureClass.QUEUE_FULL,
                demand,
                demand.envelope,
                now,
                extra=f"; {demand.consumer} already has {queue.waiting_for(demand.consumer)} "
                "requests waiting",
            )
            return Admission(
                ticket_id, failure=failure, effects=(*effects, failure_event(failure, now))
            )
        if ticket.state is TicketState.WAITING:
            effects.append(
                Event(
                    EventKind.TICKET_QUEUED,
                    now,
                    key=demand.key,
                    gpu=gpu,
                    bytes=ticket.demand.envelope,
                )
            )
            return Admission(ticket_id, effects=tuple(effects))
        mine = [e for e in effects if isinstance(e, Grant | Reject) and e.ticket_id == ticket_id]
        rest = tuple(e for e in effects if not any(e is m for m in mine))
        if isinstance(mine[0], Grant):
            return Admission(ticket_id, lease=mine[0].lease, effects=rest)
        return Admission(ticket_id, failure=mine[0].failure, effects=rest)

    def _at_once(self, ticket: Ticket, now: float) -> Admission:
        """Grant a ticket from what the queue's tail leaves, or defer it: it never goes
        ahead of a waiting ticket, and nothing is queued or evicted for it."""
        gpu = ticket.demand.gpu
        effects: list[Effect] = []
        tail = self._tails.get(gpu)
        if tail is None or tail.version != self.books.stamp(gpu):
            effects.extend(self.schedule(gpu, now))
            tail = self._tails[gpu]
        decision = self._decide(ticket, tail, now)
        if floors.may_degrade(ticket.demand, decision):
            assert decision.failure is not None
            decision = self._floor(ticket, tail, decision, now, decision.failure)
        if decision.kind is not PlanKind.GRANT:
            return Admission(ticket.id, effects=tuple(effects), deferred=True)
        lease = self._grant(ticket, tail, decision, now, effects)
        # Its own grant is the answer, not an effect for a waiter.
        rest = tuple(e for e in effects if not (isinstance(e, Grant) and e.ticket_id == ticket.id))
        return Admission(ticket.id, lease=lease, effects=rest)

    def refuse_draining(self, demand: Demand, ticket_id: int, now: float) -> Admission | None:
        """A draining consumer's new demand fails at once (None: the consumer is not draining)."""
        if demand.consumer not in self.operator.draining:
            return None
        self.gave_up(demand)
        failure = Failure(
            FailureClass.RESIDENCY_CONFLICT,
            f"RESIDENCY_CONFLICT: consumer {demand.consumer} is draining",
            consumer=demand.consumer,
            model=demand.model,
            gpu=demand.gpu,
            bytes_needed=demand.envelope,
            retry_after=DRAINING_RETRY_AFTER,
        )
        return Admission(ticket_id, failure=failure, effects=(failure_event(failure, now),))

    def _hold(self, demand: Demand, ticket_id: int, now: float, *, why: str = "") -> Admission:
        """Queue a demand without planning it: its GPU is paused (it waits for resume), or
        `why` (it waits for the next sample)."""
        queue = self.queues.setdefault(demand.gpu, TicketQueue())
        if queue.waiting_for(demand.consumer) >= self._queue_limit(demand.consumer):
            self.gave_up(demand)
            failure = self._fail(
                FailureClass.QUEUE_FULL,
                demand,
                demand.envelope,
                now,
                extra=f"; {demand.consumer} already has {queue.waiting_for(demand.consumer)} "
                "requests waiting",
            )
            return Admission(ticket_id, failure=failure, effects=(failure_event(failure, now),))
        wait = self._max_wait(demand) if demand.max_wait is None else demand.max_wait
        self._enqueue(Ticket(ticket_id, demand, arrived=now, deadline=now + wait))
        queued = Event(
            EventKind.TICKET_QUEUED,
            now,
            key=demand.key,
            gpu=demand.gpu,
            bytes=demand.envelope,
            detail=why or f"admission on GPU {demand.gpu} is paused",
        )
        return Admission(ticket_id, effects=(queued,))

    def cancel(self, ticket_id: int, now: float) -> list[Effect]:
        """The client of a waiting ticket went away."""
        ticket = self.tickets.get(ticket_id)
        if ticket is None:
            return []
        self._dequeue(ticket)
        ticket.state = TicketState.CANCELLED
        self.gave_up(ticket.demand)
        demand = ticket.demand
        cancelled = Event(
            EventKind.TICKET_CANCELLED,
            now,
            key=demand.key,
            gpu=demand.gpu,
            wait=now - ticket.arrived,
            detail="its client went away",
        )
        return [cancelled, *self.schedule(demand.gpu, now)]

    def reject(self, ticket: Ticket, failure: Failure, now: float) -> list[Effect]:
        """Fail a waiting ticket."""
        self._dequeue(ticket)
        ticket.state = TicketState.FAILED
        self.gave_up(ticket.demand)
        return [Reject(ticket.id, failure), failure_event(failure, now)]

    def gave_up(self, demand: Demand) -> None:
        """A demand ended without a grant: a started job's is marked, for its runtime is to
        drop the job, and what the job took stays to be settled (`GateCore.withdrawn`)."""
        if demand.started is not None:
            self.withdrawing.setdefault((demand.consumer, demand.gpu), []).append(demand)
            self.books.touch(residents=False, gpu=demand.gpu)

    def expire(self, now: float) -> tuple[list[Effect], set[int]]:
        """Fail tickets past their deadline; returns effects and the GPUs to re-plan."""
        effects: list[Effect] = []
        gpus: set[int] = set()
        for ticket in list(self.tickets.values()):
            if ticket.deadline <= now:
                gpus.add(ticket.demand.gpu)
                if ticket.demand.floor is not None and ticket.id not in self.last_call:
                    # Its floor may be free: the pass that follows grants it or fails it.
                    self.last_call.add(ticket.id)
                    continue
                extra = f"; {ticket.allocating}" if ticket.allocating else ""
                effects.extend(self.reject(ticket, self._timed_out(ticket, now, extra), now))
        for ticket_id, at in self.wake.items():
            ticket = self.tickets.get(ticket_id)
            if ticket is not None and at <= now:
                gpus.add(ticket.demand.gpu)
        return effects, gpus

    def _timed_out(self, ticket: Ticket, now: float, extra: str = "") -> Failure:
        """LEASE_TIMEOUT for a ticket still waiting at its deadline."""
        return self._fail(
            FailureClass.LEASE_TIMEOUT,
            ticket.demand,
            ticket.demand.envelope,
            now,
            extra=f"; waited {now - ticket.arrived:.1f}s, the most class "
            f"{ticket.demand.priority.label} may wait{floors.at_floor_note(ticket.demand)}"
            f"{extra}{self.after_evictions(ticket)}",
        )

    def headroom(self, gpu: int) -> int:
        """What self-sizing loads granted below their ceiling may take on the GPU beyond the
        books: loads under way, and loads completed that no sample has shown yet."""
        sampled_at = self.telemetry.observed_at.get(gpu)
        return floors.headroom(self.books, gpu) + self.after_loads.on(gpu, sampled_at)

    def next_wakeup(self) -> float | None:
        times = [t.deadline for t in self.tickets.values()] + list(self.wake.values())
        return min(times) if times else None

    def left(self, gpu: int) -> tuple[int, int, frozenset[ResidentKey]] | None:
        """What the last pass over the GPU's queue left for a ticket that sorts last:
        (schedulable, pool, claimed). None when the books changed since that pass (the
        next submit plans the queue again first). Read-only."""
        tail = self._tails.get(gpu)
        if tail is None or tail.version != self.books.stamp(gpu):
            return None
        return tail.schedulable, tail.pool, frozenset(tail.claimed)

    # -- the pass ------------------------------------------------------------------------

    def schedule(self, gpu: int, now: float, no_wait: Iterable[int] = ()) -> list[Effect]:
        """Walk the GPU's queue in order; grant, evict for, or fail each ticket."""
        effects: list[Effect] = []
        budget = self.telemetry.budget(gpu, self.books)
        schedulable = budget.schedulable if budget else 0
        view = ResidentView(
            self._source(gpu), now, self.planner, version=self.books.residents_version
        )
        # Jobs being withdrawn may still be running: what they may take is nobody's.
        unexplained = self.telemetry.unexplained.get(gpu, {})
        pool = schedulable - early.withheld(gpu, unexplained, self.withdrawing)
        # What loads that size themselves, granted below their ceiling, may still take.
        pool -= self.headroom(gpu)
        tail = Tail(self.books.stamp(gpu), schedulable, pool, set(), set(), view)
        queue = self.queues.get(gpu)
        # While an overrun grows, what the budget says now may be gone by the next sample.
        paused = gpu in self.operator.paused or self.telemetry.overruns.growing(gpu)
        if queue and budget is not None and not paused and self._usable(gpu, now) is None:
            no_wait = set(no_wait)
            for ticket in queue:
                if ticket.demand.key in tail.riding:
                    continue
                outcome = self._plan_one(
                    ticket, tail, now, effects, may_wait=ticket.id not in no_wait
                )
                if outcome is Outcome.FULL:
                    self._full.add(ticket.id)
        tail.version = self.books.stamp(gpu)
        self._tails[gpu] = tail
        return effects

    def _decide(self, ticket: Ticket, tail: Tail, now: float, demand: Demand | None = None) -> Plan:
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
        decision = plan(
            early.planned(demand, own),
            pool=tail.pool + replaced,
            schedulable=tail.schedulable + replaced,
            residents=self._view(tail, gpu, now),
            now=now,
            deadline=ticket.deadline,
            settings=self.planner,
            claimed=tail.claimed,
            releasable_unexplained=releasable,
            may_evict=not any(key in self.books.unloads for key in ticket.evicting),
            held=held_by(self.books.residents.values(), demand),
        )
        if decision.kind is not PlanKind.GRANT or demand.sizing is not Sizing.FITS_FREE:
            return decision
        return floors.await_allocations(demand, decision, self.telemetry.budget(gpu, self.books))

    def _floor(
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
                chance = self._decide(ticket, tail, now, reaching)
                if chance.kind in (PlanKind.GRANT, PlanKind.EVICT):
                    ticket.demand = reaching
                    return chance
        chance = self._decide(ticket, tail, now, floored)
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

    def _grant(
        self, ticket: Ticket, tail: Tail, decision: Plan, now: float, effects: list[Effect]
    ) -> Lease:
        """Grant a ticket as planned."""
        demand = ticket.demand
        gpu = demand.gpu
        if ticket.id in self.tickets:
            self._dequeue(ticket)
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
        if demand.degraded is not None:
            effects.append(floors.degraded_event(lease))
        tail.version = self.books.stamp(gpu)
        return lease

    def _plan_one(
        self, ticket: Ticket, tail: Tail, now: float, effects: list[Effect], *, may_wait: bool
    ) -> Outcome:
        """Plan one ticket against what earlier tickets left, and apply the plan."""
        if ticket.id in self.last_call:
            return self._last_call(ticket, tail, now, effects)
        demand = ticket.demand
        gpu = demand.gpu
        releasable = 0 if UNEXPLAINED in tail.claimed else self._releasable_unexplained(gpu)
        decision = self._decide(ticket, tail, now)
        if (
            self._elsewhere(demand, now) is None
            and decision.kind in (PlanKind.WAIT, PlanKind.FAIL)
            and self.preempt is not None
        ):
            decision = self._preempting(ticket, tail, decision, now, effects, may_wait) or decision
        if floors.may_degrade(demand, decision):
            assert decision.failure is not None
            decision = self._floor(ticket, tail, decision, now, decision.failure)
            demand = ticket.demand
        queued = ticket.id in self.tickets
        if decision.kind is PlanKind.GRANT:
            self._grant(ticket, tail, decision, now, effects)
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
                f"{self.after_evictions(ticket, tail)}",
            )
            if queued:
                effects.extend(self.reject(ticket, failure, now))
            else:
                ticket.state = TicketState.FAILED
                self.gave_up(demand)
                effects.append(Reject(ticket.id, failure))
                effects.append(failure_event(failure, now))
            if demand.started is not None:
                # Still running until its runtime drops it: the rest of the pass keeps off.
                tail.pool -= max(0, decision.needed)
            return Outcome.FAILED
        if not may_wait:
            return Outcome.FULL
        ticket.allocating = decision.reason if floors.allocating(decision) else ""
        if decision.kind is PlanKind.EVICT:
            ticket.evicting = decision.victims
            before = self._schedulable(gpu)
            record_evictions(self.telemetry, self.books, ticket, decision.victims, now)
            for key in decision.victims:
                resident = self.books.residents[key]
                reason = (
                    UnloadReason.REPLACE if key.model == demand.model else UnloadReason.EVICTION
                )
                effects.append(self.books.start_unload(resident, reason, ticket.id, now))
                effects.append(
                    Event(
                        EventKind.EVICTION_STARTED,
                        now,
                        key=key,
                        gpu=gpu,
                        bytes=resident.bytes,
                        reason=reason.value,
                        detail=f"for {demand.key} ({demand.priority.label}); "
                        f"{format_gib(before)} schedulable before",
                        schedulable_before=before,
                    )
                )
                effects.extend(self.books.unload_parts(resident, reason, None, now))
        if decision.earliest is not None and decision.earliest > now:
            self.wake[ticket.id] = decision.earliest
        else:
            self.wake.pop(ticket.id, None)
        tail.claimed.update(decision.counting_on)
        if releasable and decision.kind is PlanKind.WAIT:
            tail.claimed.add(UNEXPLAINED)
        tail.riding.add(demand.key)
        self._credited(ticket, tail)
        tail.pool -= early.kept_back(demand, decision)
        tail.version = self.books.stamp(gpu)
        return Outcome.WAITING

    def _last_call(self, ticket: Ticket, tail: Tail, now: float, effects: list[Effect]) -> Outcome:
        """A ticket with a floor at its deadline: its ceiling if that is free now, else its
        floor if that is, evicting nobody (an eviction would end past the deadline); else
        LEASE_TIMEOUT."""
        self.last_call.discard(ticket.id)
        decision = self._decide(ticket, tail, now)
        if decision.kind is not PlanKind.GRANT and ticket.demand.degraded is None:
            decision = self._floor(ticket, tail, decision, now, FailureClass.LEASE_TIMEOUT)
        if decision.kind is PlanKind.GRANT:
            self._grant(ticket, tail, decision, now, effects)
            return Outcome.GRANTED
        failure = self._timed_out(ticket, now, f"; {decision.reason}")
        effects.extend(self.reject(ticket, failure, now))
        return Outcome.FAILED

    def _elsewhere(self, demand: Demand, now: float) -> Plan | None:
        """The model is resident, or loading, on another of its consumer's GPUs (placed
        there after this ticket queued here): the runtime holds one copy of it, so that copy
        serves this request too — at once, or once it has loaded."""
        if not demand.loads_model:
            return None
        copy = self.books.residents.get(demand.key)
        if copy is None or copy.gpu == demand.gpu:
            return None
        if copy.state is ResidentState.RESIDENT:
            return Plan(PlanKind.GRANT, 0, reason=f"{copy.key} is resident on GPU {copy.gpu}")
        if copy.state is ResidentState.LOADING:
            return Plan(
                PlanKind.WAIT,
                0,
                counting_on=(copy.key,),
                earliest=now,
                reason=f"{copy.key} is loading on GPU {copy.gpu}",
            )
        return None

    def _view(self, tail: Tail, gpu: int, now: float) -> ResidentView:
        """The pass's resident view, rebuilt when a grant or an eviction changed the books."""
        version = self.books.residents_version
        if tail.view.now != now or tail.view.version != version:
            tail.view = ResidentView(self._source(gpu), now, self.planner, version=version)
        return tail.view

    def _source(self, gpu: int) -> GpuResidents:
        source = self._residents.get(gpu)
        if source is None:
            source = self._residents[gpu] = GpuResidents(self.books, gpu)
        return source.current()

    def _preempting(
        self,
        ticket: Ticket,
        tail: Tail,
        decision: Plan,
        now: float,
        effects: list[Effect],
        may_wait: bool,
    ) -> Plan | None:
        """A ticket that cannot have its bytes otherwise waits for jobs it may stop: those
        already being stopped for it, or, now, the fewest that make it fit."""
        jobs = self.jobs
        if jobs is None or self.preempt is None:
            return None
        demand = ticket.demand
        stopping = [p for p in jobs.by_consumer.values() if p.preempted_for == ticket.id]
        if not stopping and may_wait:
            stopping = choose_preemption(
                demand,
                pool=tail.pool,
                view=self._view(tail, demand.gpu, now),
                claimed=tail.claimed,
                job_leases=list(jobs.by_consumer.values()),
                books=self.books,
                classes=self.preempt,
                now=now,
                settings=self.planner,
            )
            before = self._schedulable(demand.gpu) if stopping else 0
            for pool in stopping:
                pool.preempted_for = ticket.id
                consumer = pool.lease.key.consumer
                names = sorted(pool.names, key=lambda name: max(pool.names[name]), reverse=True)
                effects.append(Preempt(consumer, demand.gpu, tuple(names), pool.bytes, ticket.id))
                effects.append(
                    Event(
                        EventKind.PREEMPTION_STARTED,
                        now,
                        consumer=consumer,
                        model=pool.lease.key.model,
                        gpu=demand.gpu,
                        bytes=pool.bytes,
                        reason=demand.priority.label,
                        detail=f"jobs {', '.join(names)} of {consumer} for {demand.key} "
                        f"({demand.priority.label}); {format_gib(before)} schedulable before",
                        schedulable_before=before,
                    )
                )
            if stopping:
                keys = tuple(pool.lease.key for pool in stopping)
                freed = sum(pool.bytes for pool in stopping)
                record_evictions(self.telemetry, self.books, ticket, keys, now, freed=freed)
                self.books.touch()
        if not stopping:
            return None
        return Plan(
            PlanKind.WAIT,
            decision.needed,
            eventual=sum(p.bytes for p in stopping),
            earliest=now,
            reason="waiting for the jobs it preempted to end",
        )

    def after_evictions(self, ticket: Ticket, tail: Tail | None = None) -> str:
        """For the failure of a ticket that had residents evicted for it: what changed
        since its plan began ("" for one that evicted nothing)."""
        ahead = 0 if tail is None else max(0, tail.schedulable - tail.pool)
        return after_evictions(self.telemetry, self.books, ticket, ahead=ahead)

    def _schedulable(self, gpu: int) -> int:
        """The GPU's schedulable bytes now (for the record of an eviction)."""
        budget = self.telemetry.budget(gpu, self.books)
        return 0 if budget is None else budget.schedulable

    def _releasable_unexplained(self, gpu: int) -> int:
        rows = self.telemetry.unexplained.get(gpu, {})
        return sum(b for c, b in rows.items() if c in self._reconcilable)

    def _enqueue(self, ticket: Ticket) -> None:
        self.tickets[ticket.id] = ticket
        self.queues.setdefault(ticket.demand.gpu, TicketQueue()).add(ticket)
        self.books.touch(residents=False, gpu=ticket.demand.gpu)

    def _dequeue(self, ticket: Ticket) -> None:
        if self.tickets.pop(ticket.id, None) is not None:
            self.queues[ticket.demand.gpu].remove(ticket)
        self.wake.pop(ticket.id, None)
        self.last_call.discard(ticket.id)
        self.books.touch(residents=False, gpu=ticket.demand.gpu)
