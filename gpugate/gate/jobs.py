"""Jobs: the gate's side of JOB leases for runtimes that say when their jobs end.

For each consumer whose runtime has `Jobs`, one loop asks the runtime every
JOB_POLL_INTERVAL which of the live jobs the runtime no longer has, while the consumer
has any (it sleeps on an event otherwise; an unload asked through the gate makes it ask
at once), each call bounded by `timeouts.control`. A
call that fails is recorded as a failure of its class (logged once a minute) and the loop
goes on; a runtime that refuses the connection, or whose memory NVML no longer shows
after it was seen holding some while its jobs were live, has lost them all: each ends
with RUNTIME_CRASH.

While a job is live the consumer's NVML peak is kept; a job that ended well, alone in
its consumer's queue all along, leaves that peak as the measured envelope of its kind
(the lease key of its request: for ComfyUI, the file set) with the scale it ran at.

The idle memory of a runtime whose unloads go back to an idle context
(`ReclaimRule.to_idle`) is learned here too: what NVML shows for the consumer while the
books hold nothing for it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Sequence
from typing import Protocol

import attrs

from gpugate.core.effects import Effect, Preempt
from gpugate.core.failures import Failure, FailureClass
from gpugate.core.observation import HostObservation
from gpugate.core.residents import ResidentKey
from gpugate.core.state import GateCore
from gpugate.core.tickets import Lease
from gpugate.gate.envelopes import EnvelopeBook
from gpugate.gate.link import Link
from gpugate.gate.upstream import upstream_failure
from gpugate.runtimes.base import Jobs
from gpugate.store.db import Store

JOB_POLL_INTERVAL = 0.5


@attrs.define
class JobPeak:
    """What the gate measures of one live job."""

    kind: ResidentKey
    scale: float
    peak: int = 0
    alone: bool = True
    degraded: bool = False
    """Granted its floor: it ran in what it was given, and its peak says nothing of what
    it takes with room."""


class JobOwner(Protocol):
    """What job watching hands the gate: the core's effects of a job's end, and failures."""

    def apply(self, effects: Sequence[Effect], *, timers: bool = True) -> None: ...

    def report(self, failure: Failure) -> None: ...

    def loop_failed(self, loop: str, failure: Failure) -> None: ...


class JobWatch:
    """The gate's side of jobs: when they start and end, and what they are measured at."""

    def __init__(
        self,
        core: GateCore,
        links: dict[str, Link],
        envelopes: EnvelopeBook,
        clock: Callable[[], float],
        store: Store | None,
        owner: JobOwner,
    ) -> None:
        self.core = core
        self.links = links
        self.envelopes = envelopes
        self.clock = clock
        self.store = store
        self.owner = owner
        self._watches: dict[int, JobPeak] = {}

    def start(self, spawn: Callable[..., None]) -> None:
        """A loop for each consumer whose runtime says when its jobs end."""
        for link in self.links.values():
            jobs = link.runtime.jobs
            if jobs is not None:
                spawn(self._job_loop(link, jobs), f"jobs-{link.consumer.name}")

    # -- what the runtime and the listener report ----------------------------------------

    def started(
        self,
        lease: Lease,
        job: str | None,
        *,
        kind: ResidentKey | None = None,
        scale: float = 0.0,
    ) -> None:
        """The runtime queued the job a JOB lease was granted for, as `job` (its own name
        for it, when it has one; the lease's id names it otherwise). `kind`: the key its
        measured peak is kept under."""
        if job is not None:
            self.core.job_events.job_started(lease.id, job)
        if kind is not None:
            self._watch(lease, kind, scale)

    def finished(self, consumer: str, job: int | str, *, failed: bool = False) -> None:
        """A job finished, failed, was interrupted or deleted (by lease id or its name: a
        name the runtime no longer has ends every job it named)."""
        self._finished(consumer, job, failed=failed)
        while isinstance(job, str) and self.core.jobs.find(consumer, job) is not None:
            self._finished(consumer, job, failed=failed)

    def _finished(self, consumer: str, job: int | str, *, failed: bool) -> None:
        now = self.clock()
        job_id = self.core.jobs.find(consumer, job)
        lease = None if job_id is None else self.core.lease(job_id)
        self.owner.apply(self.core.job_events.job_done(consumer, job, now, failed=failed))
        if job_id is not None:
            self._ended(job_id, failed=failed)
        if lease is not None and self.store is not None:
            self.store.record_lease(lease, now - lease.granted, "failed" if failed else "done")

    def preempted(self, effect: Preempt, failure: Failure | None) -> None:
        """The runtime was asked to stop the jobs (`failure`: it could not be)."""
        now = self.clock()
        before = {x.id: x for x in self.live(effect.consumer) if x.gpu == effect.gpu}
        self.owner.apply(
            self.core.job_events.preempted(
                effect.consumer, effect.gpu, effect.jobs, now, failure=failure
            )
        )
        for lease_id, lease in before.items():
            if self.core.lease(lease_id) is None:
                self._ended(lease_id, failed=True)
                if self.store is not None:
                    self.store.record_lease(lease, now - lease.granted, "preempted")

    def live(self, consumer: str) -> list[Lease]:
        """The consumer's live jobs' leases, by id."""
        return sorted(
            (x for x in self.core.leases() if x.job_of is not None and x.key.consumer == consumer),
            key=lambda x: x.id,
        )

    def names(self, consumer: str) -> frozenset[str]:
        """The runtime's names of the consumer's live jobs."""
        names: set[str] = set()
        for (owner, _), pool in self.core.jobs.by_consumer.items():
            if owner == consumer:
                names.update(pool.names)
        return frozenset(names)

    # -- what a job is measured at -------------------------------------------------------

    def _watch(self, lease: Lease, kind: ResidentKey, scale: float) -> None:
        """Measure a job of `kind` from now to its end."""
        others = [x for x in self.live(kind.consumer) if x.id != lease.id]
        degraded = lease.demand.degraded is not None
        self._watches[lease.id] = JobPeak(kind, scale, alone=not others, degraded=degraded)
        for other in others:
            watch = self._watches.get(other.id)
            if watch is not None:
                watch.alone = False
        link = self.links.get(kind.consumer)
        if link is not None:
            link.jobs_live.set()

    def _ended(self, lease_id: int, *, failed: bool) -> None:
        """Keep the peak of a job that ran alone and well, with its whole envelope, as its
        kind's measured envelope."""
        watch = self._watches.pop(lease_id, None)
        if watch is None or failed or not watch.alone or watch.degraded or watch.peak <= 0:
            return
        self.envelopes.learn_job(watch.kind, watch.peak, watch.scale)

    def observe(self, sample: HostObservation) -> None:
        """Peaks of live jobs; the idle memory of runtimes that unload to an idle context."""
        if sample.error is not None:
            return
        for link in self.links.values():
            name = link.consumer.name
            device = sample.device(link.consumer.cards[0])
            if device is None:
                continue
            held = device.managed.get(name, 0)
            live = self.live(name) if link.runtime.jobs is not None else []
            for lease in live:
                watch = self._watches.get(lease.id)
                if watch is not None:
                    watch.peak = max(watch.peak, held)
            if live and held > 0:
                link.seen_holding = True
            if link.runtime.residents.reclaim_rule.to_idle and not self._booked(name):
                link.idle_bytes = held

    def _booked(self, consumer: str) -> bool:
        return any(r.key.consumer == consumer for r in self.core.residents()) or any(
            x.key.consumer == consumer for x in self.core.leases()
        )

    # -- asking the runtime --------------------------------------------------------------

    def end_all(self, link: Link, failure: Failure) -> None:
        """Every live job of the consumer is lost (its runtime died)."""
        name = link.consumer.name
        lost = self.live(name)
        if not lost:
            return
        self.owner.report(failure)
        for lease in lost:
            self.finished(name, lease.id, failed=True)
        link.seen_holding = False

    async def _job_loop(self, link: Link, jobs: Jobs) -> None:
        name = link.consumer.name
        while True:
            if not self.live(name):
                link.seen_holding = False
                link.jobs_live.clear()
                await link.jobs_live.wait()
                continue
            link.jobs_check.clear()
            await self._track_once(link, jobs)
            # asyncio.timeout, not wait_for: on 3.11 wait_for can swallow a cancellation.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(JOB_POLL_INTERVAL):
                    await link.jobs_check.wait()

    async def _track_once(self, link: Link, jobs: Jobs) -> None:
        name = link.consumer.name
        gpu = link.consumer.cards[0]
        observation = self.core.observation(gpu)
        if link.seen_holding and observation is not None and observation.managed.get(name, 0) == 0:
            message = (
                f"RUNTIME_CRASH: {name}'s processes no longer hold GPU memory; its jobs are lost"
            )
            failure = Failure(FailureClass.RUNTIME_CRASH, message, consumer=name, gpu=gpu)
            self.end_all(link, failure)
            return
        assert link.session is not None
        try:
            async with asyncio.timeout(link.consumer.timeouts.control):
                ends = await jobs.track_jobs(link.session, self.names(name))
        except Exception as exc:
            failure = upstream_failure(link.consumer, exc, f"cannot learn how {name}'s jobs went")
            if failure.failure_class is FailureClass.RUNTIME_CRASH:
                message = f"{failure.message}; its jobs are lost"
                self.end_all(link, attrs.evolve(failure, message=message))
            else:
                self.owner.loop_failed(f"jobs-{name}", failure)
            return
        for end in ends:
            self.finished(name, end.job, failed=end.failed)
