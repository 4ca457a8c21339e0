"""Queueing: admit a demand to its GPU's queue (grant, queue, hold or fail it), a ticket
that leaves (cancelled, failed, timed out), and the timers; each pass over a queue is
`gpugate.core.queue_pass`'s.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from gpugate.core import floors, swaps
from gpugate.core.books import Books
from gpugate.core.effects import Effect, Event, EventKind, Grant, Reject
from gpugate.core.failures import Failure, FailureClass
from gpugate.core.job_leases import JobBook
from gpugate.core.margins import after_evictions
from gpugate.core.operator import OperatorBook
from gpugate.core.passes import (
    UNEXPLAINED,
    Admission,
    FailureFactory,
    Outcome,
    Tail,
    failure_event,
    granted_event,
)
from gpugate.core.planner import Plan, PlanKind, PlannerSettings
from gpugate.core.preemption import PreemptClasses
from gpugate.core.queue import TicketQueue
from gpugate.core.queue_pass import QueuePass
from gpugate.core.residents import ResidentKey
from gpugate.core.telemetry import Telemetry
from gpugate.core.tickets import Demand, Ticket, TicketState

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
        self._usable = usable
        self._fail = fail
        self.tickets: dict[int, Ticket] = {}
        self.queues: dict[int, TicketQueue] = {}
        self.wake: dict[int, float] = {}
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
        self.plans: dict[int, Plan] = {}
        """Each waiting ticket's decision in the last pass that planned it: what it waits
        for, as the queue view tells it (`gpugate.core.waits`)."""
        self.swaps = swaps.SwapBook()
        """Recent evictions for demands, to tell a reload that is a swap."""
        self.passes = QueuePass(self, usable=usable, fail=fail, reconcilable=reconcilable)
        """The passes over the queues, and what each GPU's last one left."""

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
        if resident is not None and swaps.may_reuse(
            self.queues.get(gpu), demand, now, ticket_id, resident.key, now, self.planner
        ):
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
            tail = self.passes.tails.get(gpu)
            if tail is None or tail.version != self.books.stamp(gpu):
                effects.extend(self.schedule(gpu, now))
                tail = self.passes.tails[gpu]
            outcome = self.passes.plan_one(ticket, tail, now, effects, may_wait=may_wait)
            if outcome is Outcome.WAITING:
                self._enqueue(ticket)
                tail.version = self.books.stamp(gpu)
        else:
            self._enqueue(ticket)
            effects.extend(self.schedule(gpu, now, no_wait=() if may_wait else (ticket_id,)))
            outcome = Outcome.WAITING if ticket.state is TicketState.WAITING else Outcome.GRANTED
            if ticket_id in self.passes.full:
                self.passes.full.discard(ticket_id)
                self.dequeue(ticket)
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
        tail = self.passes.tails.get(gpu)
        if tail is None or tail.version != self.books.stamp(gpu):
            effects.extend(self.schedule(gpu, now))
            tail = self.passes.tails[gpu]
        decision = self.passes.decide(ticket, tail, now)
        if floors.may_degrade(ticket.demand, decision):
            assert decision.failure is not None
            decision = self.passes.floor(ticket, tail, decision, now, decision.failure)
        if decision.kind is not PlanKind.GRANT or self.passes.barred(ticket, decision, now):
            return Admission(ticket.id, effects=tuple(effects), deferred=True)
        lease = self.passes.grant(ticket, tail, decision, now, effects)
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
        self.dequeue(ticket)
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
        self.dequeue(ticket)
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
                effects.extend(self.reject(ticket, self.timed_out(ticket, now, extra), now))
        for ticket_id, at in self.wake.items():
            ticket = self.tickets.get(ticket_id)
            if ticket is not None and at <= now:
                gpus.add(ticket.demand.gpu)
        return effects, gpus

    def timed_out(self, ticket: Ticket, now: float, extra: str = "") -> Failure:
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
        tail = self.passes.tails.get(gpu)
        if tail is None or tail.version != self.books.stamp(gpu):
            return None
        return tail.schedulable, tail.pool, frozenset(tail.claimed)

    # -- the pass ------------------------------------------------------------------------

    def schedule(self, gpu: int, now: float, no_wait: Iterable[int] = ()) -> list[Effect]:
        """Walk the GPU's queue in order; grant, evict for, or fail each ticket
        (`gpugate.core.queue_pass`)."""
        return self.passes.schedule(gpu, now, no_wait)

    def held_behind(
        self, demand: Demand, arrived: float, ticket_id: int, resident: ResidentKey, now: float
    ) -> Ticket | None:
        """The earlier ticket past the swap bound that keeps `demand` from being served from
        the loaded `resident` now (None: it may be). Read-only."""
        queue = self.queues.get(demand.gpu)
        return swaps.held_behind(queue, demand, arrived, ticket_id, resident, now, self.planner)

    def after_evictions(self, ticket: Ticket, tail: Tail | None = None) -> str:
        """For the failure of a ticket that had residents evicted for it: what changed
        since its plan began ("" for one that evicted nothing)."""
        ahead = 0 if tail is None else max(0, tail.schedulable - tail.pool)
        return after_evictions(self.telemetry, self.books, ticket, ahead=ahead)

    def _enqueue(self, ticket: Ticket) -> None:
        self.tickets[ticket.id] = ticket
        self.queues.setdefault(ticket.demand.gpu, TicketQueue()).add(ticket)
        self.books.touch(residents=False, gpu=ticket.demand.gpu)

    def dequeue(self, ticket: Ticket) -> None:
        if self.tickets.pop(ticket.id, None) is not None:
            self.queues[ticket.demand.gpu].remove(ticket)
        self.wake.pop(ticket.id, None)
        self.plans.pop(ticket.id, None)
        self.last_call.discard(ticket.id)
        self.books.touch(residents=False, gpu=ticket.demand.gpu)
