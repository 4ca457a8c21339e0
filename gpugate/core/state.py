"""The core state: the gate's books, changed only by events, answering with effects.

`GateCore` owns residents, leases and queued tickets for every GPU. Each public method
is one event (a demand, a release, a sample, a listing, a timer, an unload that
finished); it changes the books synchronously and returns what must happen next. There
is no I/O, no asyncio and no clock here: the caller passes `now`, so tests drive a fake
clock and the gate's event loop is the only caller.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs

from gpugate.core.books import Books
from gpugate.core.budget import GpuBudget
from gpugate.core.effects import Effect, EventKind, UnloadReason
from gpugate.core.explain import make_failure
from gpugate.core.explicit import LeaseTerms, due, explicit_demand, lapse_events, next_expiry
from gpugate.core.failures import Failure, FailureClass
from gpugate.core.job_events import JobEvents
from gpugate.core.job_leases import JobBook, job_demand
from gpugate.core.lifecycle import Life
from gpugate.core.lifecycle_events import LifecycleEvents
from gpugate.core.listing import ListedModel, resident_event
from gpugate.core.observation import DriverFault, GpuObservation, HostObservation
from gpugate.core.operator_actions import OperatorActions
from gpugate.core.reports import Reports
from gpugate.core.residents import Resident, ResidentKey
from gpugate.core.reuse import ResidentReuse
from gpugate.core.rewarm import RewarmBook
from gpugate.core.scheduling import Admission, Scheduler, granted_event
from gpugate.core.scopes import never_appeared, next_appearance, process_overdue, released_event
from gpugate.core.settings import CoreSettings
from gpugate.core.telemetry import Telemetry
from gpugate.core.tickets import Demand, Lease, LeaseScope, Ticket
from gpugate.core.units import format_gib

__all__ = ["Admission", "CoreSettings", "GateCore", "ListedModel"]


class GateCore:
    """The single owner of the gate's books. Every public method that takes `now` is one
    event, its parts' too (`lifecycles`, `job_events`, `operator`, `reports`: what the world
    reports is answered there, and here through its method of the same name); the rest are
    views."""

    def __init__(self, settings: CoreSettings) -> None:
        self.settings = settings
        self.books = Books()
        self.jobs = JobBook(self.books)
        self.books.jobs = self.jobs
        self.telemetry = Telemetry(
            settings.reserve, dict(settings.reserve_by_gpu), settings.consumer_gpus
        )
        self.scheduler = Scheduler(
            self.books,
            self.telemetry,
            planner=settings.planner,
            max_wait=lambda demand: settings.wait_for(demand.priority),
            queue_limit=lambda c: settings.queue_limit.get(c, settings.default_queue_limit),
            reconcilable=settings.reconcilable,
            usable=self._unusable,
            fail=self.failure,
        )
        # Read through the settings, so that a reload's new `preempt` applies at once.
        self.scheduler.jobs = self.jobs
        self.scheduler.preempt = lambda consumer: self.settings.preempt.get(consumer, frozenset())
        self.reuse = ResidentReuse(self.books, self.scheduler)
        """The resident-model case of `submit` and `release`, without effects."""
        self.operator = OperatorActions(self.books, self.scheduler, self.budget)
        """An operator's actions: evict a resident, drain a consumer, pause a GPU."""
        self.lifecycles = LifecycleEvents(self.books, self)
        """Runtimes started, stopped, put to sleep and woken."""
        self.job_events = JobEvents(self)
        """Jobs' starts and ends, their preemption and withdrawal."""
        self.reports = Reports(self.books, self.telemetry, self.scheduler, fail=self.failure)
        """What the world reports: loads and processes up or ended, samples, listings and
        finished unloads (`gpugate.core.reports`)."""
        self.rewarms = RewarmBook()
        """Kept-warm models evicted for a higher class, to be loaded again
        (`gpugate.core.rewarm`)."""

    # -- views ---------------------------------------------------------------------------

    @property
    def fault(self) -> DriverFault | None:
        return self.telemetry.fault

    def gpus(self) -> list[int]:
        return sorted(self.telemetry.observations)

    def observation(self, gpu: int) -> GpuObservation | None:
        return self.telemetry.observations.get(gpu)

    def sample_age(self, gpu: int, now: float) -> float | None:
        return self.telemetry.sample_age(gpu, now)

    def budget(self, gpu: int) -> GpuBudget | None:
        return self.telemetry.budget(gpu, self.books)

    def in_pressure(self, gpu: int) -> bool:
        gauge = self.telemetry.pressure.get(gpu)
        return bool(gauge and gauge.active)

    def residents(self, gpu: int | None = None) -> list[Resident]:
        residents = self.books.residents.values()
        return [r for r in residents if gpu is None or r.gpu == gpu]

    def resident(self, key: ResidentKey) -> Resident | None:
        return self.books.residents.get(key)

    def leases(self) -> list[Lease]:
        return list(self.books.leases.values())

    def lease(self, lease_id: int) -> Lease | None:
        return self.books.leases.get(lease_id)

    def waiting(self, gpu: int | None = None) -> list[Ticket]:
        if gpu is not None:
            queue = self.scheduler.queues.get(gpu)
            return list(queue) if queue else []
        return [t for q in self.scheduler.queues.values() for t in q]

    def lifecycle(self, consumer: str) -> Life | None:
        return self.books.lives.get(consumer)

    def start_wait(self, consumer: str, now: float) -> float:
        """Seconds until the runtime may be started again after failures (0: now)."""
        return self.books.lives.backoff_remaining(consumer, now)

    # -- events: demands and their requests ----------------------------------------------

    def submit(self, demand: Demand, now: float, *, at_once: bool = False) -> Admission:
        """A request needs VRAM: a lease now, a ticket to wait on, or a failure. `at_once`:
        a lease only from memory nobody waits for, evicting nobody, else `deferred`."""
        made_way = self._make_way(demand, now)
        admission = self._submit(demand, now, at_once=at_once)
        if made_way:
            return attrs.evolve(admission, effects=(*made_way, *admission.effects))
        return admission

    def _make_way(self, demand: Demand, now: float) -> list[Effect]:
        """A real demand that a resident does not serve: rewarms waiting on its GPU give way."""
        if not self.rewarms.under_way or self.books.reusable(demand.key) is not None:
            return []
        return self.rewarms.make_way(self, demand.gpu, now)

    def _submit(self, demand: Demand, now: float, *, at_once: bool) -> Admission:
        if demand.scope is LeaseScope.JOB:
            if demand.consumer in self.scheduler.operator.draining:
                refused = self.scheduler.refuse_draining(demand, self.books.new_id(), now)
                assert refused is not None
                return refused
            return self._submit_job(demand, now, at_once=at_once)
        return self.scheduler.submit(demand, now, at_once=at_once)

    def cancel(self, ticket_id: int, now: float) -> list[Effect]:
        """The client of a waiting ticket went away."""
        return self.scheduler.cancel(ticket_id, now)

    # -- events: explicit leases ---------------------------------------------------------

    def ask(self, terms: LeaseTerms, now: float) -> Admission:
        """Work that is not a request asks for a lease: granted, a ticket, or a failure."""
        lease_id = self.scheduler.new_id()
        demand = explicit_demand(terms, lease_id)
        made_way = self._make_way(demand, now)
        admission = self.scheduler.submit(demand, now, ticket_id=lease_id)
        if made_way:
            return attrs.evolve(admission, effects=(*made_way, *admission.effects))
        return admission

    def renew(self, lease_id: int, now: float, longest: float | None = None) -> list[Effect]:
        """An explicit lease's holder is alive: its expiry moves to now + its ttl.

        A lease whose expiry has already come lapses here instead (the caller sees it gone).
        `longest`: the longest ttl allowed now; a lease granted a longer one before it was
        lowered keeps only that much from here on.
        """
        lease = self.books.leases.get(lease_id)
        if lease is None or lease.expires_at is None or lease.demand.lease_ttl is None:
            return []
        if lease.expires_at <= now:
            effects = self._lapse(lease, now)
            if self.scheduler.queues.get(lease.gpu):
                effects.extend(self.scheduler.schedule(lease.gpu, now))
            return effects
        if longest is not None and lease.demand.lease_ttl > longest:
            lease.demand = attrs.evolve(lease.demand, lease_ttl=longest)
        lease.expires_at = now + lease.demand.lease_ttl
        return []

    def loaded(self, lease_id: int, now: float) -> list[Effect]:
        """The runtime answered the lease's request: its model is in VRAM now."""
        return self.reports.loaded(lease_id, now)

    def process_ready(self, lease_id: int, now: float) -> list[Effect]:
        """A process started under a PROCESS lease answers: it is resident now."""
        return self.reports.process_ready(lease_id, now)

    def process_ended(self, consumer: str, now: float, detail: str) -> list[Effect]:
        """The consumer's process ended (a crash, an exit): its resident goes at once."""
        return self.reports.process_ended(consumer, now, detail)

    # -- events: a request's leases end --------------------------------------------------

    def release(self, lease_id: int, now: float, *, failed: bool = False) -> list[Effect]:
        """The lease's request ended: done, failed, or abandoned by its client.

        A job's lease ends its job (a job the runtime refused, or one abandoned before it
        was queued); a consumer's job lease ends only with its last job.
        """
        open_lease = self.books.leases.get(lease_id)
        if lease_id in self.jobs.carriers:
            return []
        if open_lease is not None and open_lease.job_of is not None:
            consumer = open_lease.key.consumer
            return self.job_events.job_done(consumer, lease_id, now, failed=failed)
        return self.release_all((lease_id,), now, failed=failed)

    def release_all(
        self, lease_ids: Sequence[int], now: float, *, failed: bool = False
    ) -> list[Effect]:
        """A request's leases ended together: the parts of a load split across GPUs all end
        before any card's queue is planned again, so no part is taken for an eviction while
        another of the same request is still held."""
        effects: list[Effect] = []
        gpus: list[int] = []
        for lease_id in lease_ids:
            open_lease = self.books.leases.get(lease_id)
            if lease_id in self.jobs.carriers or (
                open_lease is not None and open_lease.job_of is not None
            ):
                continue  # a job's lease ends with its job, not its request (`release`)
            loading = open_lease is not None and open_lease.pending > 0
            closed = self.books.close_lease(lease_id, now, failed=failed)
            if closed is None:
                continue
            lease, resident = closed
            effects.append(released_event(lease, now, "failed" if failed else "done"))
            if resident is not None and resident.idle and resident.idle_ttl == 0:
                effects.extend(self._expire(resident, now))
            if loading:
                # A load ended (completed or not): what NVML shows means something else now.
                self.telemetry.explain(lease.gpu, self.books)
            if lease.gpu not in gpus:
                gpus.append(lease.gpu)
        if not effects:
            return []
        for gpu in gpus:
            if self.scheduler.queues.get(gpu):
                effects.extend(self.scheduler.schedule(gpu, now))
        effects.extend(self.operator.drained(now))
        return effects

    # -- events: what the world reports --------------------------------------------------

    def observe(self, sample: HostObservation, now: float) -> list[Effect]:
        """A new NVML sample, or a driver fault."""
        return self.reports.observe(sample, now)

    def reconcile(
        self,
        consumer: str,
        gpus: int | Sequence[int],
        listed: Sequence[ListedModel],
        *,
        asked_at: float,
        now: float,
    ) -> list[Effect]:
        """A runtime on `gpus` listed what it has loaded (asked at `asked_at`, answered by
        `now`)."""
        return self.reports.reconcile(consumer, gpus, listed, asked_at=asked_at, now=now)

    def unloaded(
        self, key: ResidentKey, now: float, *, reclaimed: bool, failure: Failure | None = None
    ) -> list[Effect]:
        """An unload finished: NVML showed the bytes back, or it did not in time (`failure`:
        the runtime could not be asked)."""
        return self.reports.unloaded(key, now, reclaimed=reclaimed, failure=failure)

    def tick(self, now: float) -> list[Effect]:
        """Time passed: expire tickets past their deadline, residents past their TTL and
        explicit leases not renewed in time."""
        effects, gpus = self.scheduler.expire(now)
        for lease in due(self.books, now):
            effects.extend(self._lapse(lease, now))
            gpus.add(lease.gpu)
        for lease in process_overdue(self.books, now):
            effects.append(never_appeared(lease, now))
            effects.extend(self.release(lease.id, now, failed=True))
        for resident in self.residents():
            expiry = resident.expires_at()
            if expiry is not None and expiry <= now:
                effects.extend(self._expire(resident, now))
                gpus.add(resident.gpu)
        for gpu in sorted(gpus):
            effects.extend(self.scheduler.schedule(gpu, now))
        effects.extend(self.operator.drained(now))
        return effects

    def next_wakeup(self) -> float | None:
        """When `tick` next has something to do (None: nothing is timed)."""
        times = [at for r in self.books.residents.values() if (at := r.expires_at()) is not None]
        for at in (
            self.scheduler.next_wakeup(),
            next_expiry(self.books),
            next_appearance(self.books),
        ):
            if at is not None:
                times.append(at)
        return min(times) if times else None

    # -- internals -----------------------------------------------------------------------

    def _submit_job(self, demand: Demand, now: float, *, at_once: bool) -> Admission:
        """A job is granted at once within its consumer's job lease, or grows it."""
        job_id = self.books.new_id()
        held = self.jobs.held(demand.consumer, demand.gpu)
        queued = job_demand(demand, job_id, held)
        if held and queued.envelope == 0:
            lease = self.books.open_lease(job_id, queued, now, now, 0, None)
            return Admission(job_id, lease=lease, effects=(granted_event(lease),))
        return self.scheduler.submit(queued, now, ticket_id=job_id, at_once=at_once)

    def _lapse(self, lease: Lease, now: float) -> list[Effect]:
        """An explicit lease was not renewed in time: it ends and its bytes return."""
        self.books.close_lease(lease.id, now, failed=False)
        self.telemetry.explain(lease.gpu, self.books)
        return list(lapse_events(lease, now))

    def _expire(self, resident: Resident, now: float) -> list[Effect]:
        """Unload a resident idle for longer than its policy allows."""
        budget = self.budget(resident.gpu)
        before = None if budget is None else budget.schedulable
        unload = self.books.start_unload(resident, UnloadReason.TTL, None, now)
        idle = now - resident.last_used
        detail = f"idle {idle:.0f}s, its policy allows {resident.idle_ttl:.0f}s"
        if before is not None:
            detail = f"{detail}; {format_gib(before)} schedulable before"
        started = resident_event(
            EventKind.EVICTION_STARTED, now, resident, detail, reason=UnloadReason.TTL.value
        )
        parts = self.books.unload_parts(resident, UnloadReason.TTL, None, now)
        return [unload, attrs.evolve(started, schedulable_before=before), *parts]

    def _unusable(self, gpu: int, now: float) -> FailureClass | None:
        if self.telemetry.fault is not None:
            return FailureClass.DRIVER_ERROR
        age = self.telemetry.sample_age(gpu, now)
        if age is None or age > self.settings.stale_after:
            return FailureClass.SCHEDULER_STATE_STALE
        return None

    def failure(
        self,
        failure_class: FailureClass,
        demand: Demand,
        needed: int,
        now: float,
        *,
        retry_after: float | None = None,
        extra: str = "",
    ) -> Failure:
        """The failure a demand meets, worded with the budget and residents it met."""
        fault = self.telemetry.fault
        if failure_class is FailureClass.DRIVER_ERROR and fault is not None:
            extra = f"; NVML {fault.name} ({fault.code}): {fault.message}{extra}"
        elif failure_class is FailureClass.SCHEDULER_STATE_STALE:
            age = self.telemetry.sample_age(demand.gpu, now)
            seen = "no NVML sample yet" if age is None else f"last NVML sample is {age:.1f}s old"
            extra = f"; {seen}{extra}"
        return make_failure(
            failure_class,
            demand,
            needed,
            self.budget(demand.gpu),
            self.residents(demand.gpu),
            retry_after=retry_after,
            extra=extra,
        )
