"""The core's job events (a part `GateCore` holds): a runtime's queued jobs, each under its
consumer's job lease, the jobs a higher class stopped, and the jobs withdrawn from their
runtime because the lease they were accepted before could not be had."""

from __future__ import annotations

from collections.abc import Collection
from typing import Protocol

from gpugate.core.books import Books
from gpugate.core.effects import Effect, Event, EventKind, UnloadReason
from gpugate.core.failures import Failure, FailureClass
from gpugate.core.job_leases import JobBook
from gpugate.core.listing import resident_event
from gpugate.core.observation import GpuObservation
from gpugate.core.operator_actions import OperatorActions
from gpugate.core.scheduling import Scheduler
from gpugate.core.scopes import accounted, keep_held, left_behind, released_event
from gpugate.core.settings import CoreSettings
from gpugate.core.telemetry import Telemetry
from gpugate.core.tickets import Demand, Ticket


class JobBooks(Protocol):
    """What job events read and change: the core's books, queues, job leases and samples,
    and the failures and drain events it words."""

    books: Books
    scheduler: Scheduler
    jobs: JobBook
    telemetry: Telemetry
    settings: CoreSettings
    operator: OperatorActions

    def observation(self, gpu: int) -> GpuObservation | None: ...

    def waiting(self, gpu: int | None = None) -> list[Ticket]: ...

    def failure(
        self,
        failure_class: FailureClass,
        demand: Demand,
        needed: int,
        now: float,
        *,
        retry_after: float | None = None,
        extra: str = "",
    ) -> Failure: ...


class JobEvents:
    """Jobs' starts and ends, and their preemption."""

    def __init__(self, core: JobBooks) -> None:
        self.core = core

    def withdrawn(self, demand: Demand, now: float) -> list[Effect]:
        """The runtime was asked to drop a job it accepted before its lease (`demand`, whose
        lease could not be had or whose client left; `gpugate.core.early`). On each GPU
        where that demand ended, once no job of its consumer is live or waiting there, what
        NVML shows the consumer holding beyond the books, when it is more than before the
        job went up, is what the job left: it becomes the consumer's `<held>` resident and
        is given back at once."""
        started = demand.started
        if started is None:
            return []
        effects: list[Effect] = []
        withdrawing = self.core.scheduler.withdrawing
        for gpu, before in started.unexplained:
            key = (demand.consumer, gpu)
            marked = withdrawing.get(key, [])
            # The mark is the demand as queued (a job's own key and growth): the same trial.
            mine = next((d for d in marked if d.started is started), None)
            if mine is None:
                continue
            marked.remove(mine)
            self.core.books.touch(residents=False, gpu=gpu)
            if marked:
                continue
            del withdrawing[key]
            effects.extend(self._left_by_withdrawn(demand, gpu, before, now))
            effects.extend(self.core.scheduler.schedule(gpu, now))
        return effects

    def _left_by_withdrawn(self, demand: Demand, gpu: int, before: int, now: float) -> list[Effect]:
        consumer = demand.consumer
        live = self.core.jobs.by_consumer.get((consumer, gpu)) is not None or any(
            t.demand.consumer == consumer and t.demand.started is not None
            for t in self.core.waiting(gpu)
        )
        observation = self.core.observation(gpu)
        if live or observation is None:
            return []
        beyond = observation.managed.get(consumer, 0) - accounted(self.core.books, consumer, gpu)
        if beyond <= before:
            return []
        resident = keep_held(self.core.books, demand, gpu, observation, now)
        if resident is None:
            return []
        unload = self.core.books.start_unload(resident, UnloadReason.WITHDRAWN, None, now)
        detail = "left by a job its runtime ran before its lease, which could not be had"
        evicted = resident_event(
            EventKind.EVICTION_STARTED, now, resident, detail, reason=UnloadReason.WITHDRAWN.value
        )
        self.core.telemetry.explain(gpu, self.core.books)
        return [unload, evicted]

    def job_started(self, lease_id: int, job: str) -> bool:
        """The runtime queued a job's work under its own name for it (for `job_done`)."""
        return self.core.jobs.name(lease_id, job)

    def job_done(
        self, consumer: str, job: int | str, now: float, *, failed: bool = False
    ) -> list[Effect]:
        """A job finished, failed, was interrupted or deleted (by lease id or its name).

        Its consumer's job lease shrinks to the largest job left, or ends with the last;
        what the runtime keeps afterwards is a resident: named by its listing, or, for a
        runtime that cannot list, known from NVML.
        """
        job_id = self.core.jobs.find(consumer, job)
        closed = None if job_id is None else self.core.jobs.close(job_id)
        if closed is None:
            return []
        lease, pool, ended = closed
        reason = "failed" if failed else "done"
        effects: list[Effect] = [released_event(lease, now, reason)]
        if ended:
            effects.append(released_event(pool.lease, now, "jobs done"))
            if consumer not in self.core.settings.reconcilable:
                effects.extend(
                    left_behind(self.core.books, pool, self.core.observation(lease.gpu), now)
                )
        self.core.jobs.resize_waiting(self.core.waiting(lease.gpu))
        self.core.telemetry.explain(lease.gpu, self.core.books)
        effects.extend(self.core.scheduler.schedule(lease.gpu, now))
        effects.extend(self.core.operator.drained(now))
        return effects

    def preempted(
        self,
        consumer: str,
        gpu: int,
        jobs: Collection[str],
        now: float,
        *,
        failure: Failure | None = None,
    ) -> list[Effect]:
        """The consumer's jobs on a GPU were stopped (`Preempt`): each ends with a failure
        event naming who stopped it, and the ticket it was for is planned again (it evicts
        what the runtime kept). `jobs`: the runtime's names of the jobs stopped.
        `failure`: the runtime could not be asked; the jobs go on and the ticket fails
        with that class."""
        pool = self.core.jobs.by_consumer.get((consumer, gpu))
        if pool is None or pool.preempted_for is None:
            return []
        ticket = self.core.scheduler.tickets.get(pool.preempted_for)
        effects: list[Effect] = []
        if failure is not None:
            pool.preempted_for = None
            self.core.books.touch()
            if ticket is not None:
                extra = f"; {consumer}'s jobs could not be stopped: {failure.message}"
                rejection = self.core.failure(
                    failure.failure_class, ticket.demand, ticket.demand.envelope, now, extra=extra
                )
                effects.extend(self.core.scheduler.reject(ticket, rejection, now))
            effects.extend(self.core.scheduler.schedule(gpu, now))
            return effects
        # The job lease stays marked until its last job ends with it: no second `Preempt`.
        names = {job_id: name for name, ids in pool.names.items() for job_id in ids}
        by = (
            "a demand that is gone"
            if ticket is None
            else (f"{ticket.demand.key} ({ticket.demand.priority.label})")
        )
        for job_id in sorted(i for name in jobs if name in pool.names for i in pool.names[name]):
            job = self.core.books.leases.get(job_id)
            if job is None:
                continue
            label = job.demand.priority.label
            message = (
                f"RESIDENCY_CONFLICT: {consumer}'s job {names.get(job_id, job_id)} ({label}) "
                f"was preempted for {by}: {consumer} lets that class stop its jobs"
            )
            stopped = Failure(
                FailureClass.RESIDENCY_CONFLICT,
                message,
                consumer=consumer,
                model=job.key.model,
                gpu=gpu,
            )
            effects.append(
                Event(
                    EventKind.FAILURE,
                    now,
                    consumer=consumer,
                    model=job.key.model,
                    gpu=gpu,
                    failure=stopped,
                    detail=message,
                )
            )
            effects.extend(self.job_done(consumer, job_id, now, failed=True))
        if self.core.jobs.by_consumer.get((consumer, gpu)) is pool:
            # A job that came after the decision keeps the job lease: it was not stopped.
            pool.preempted_for = None
            self.core.books.touch()
            effects.extend(self.core.scheduler.schedule(gpu, now))
        return effects
