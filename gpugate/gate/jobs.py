"""Jobs: the gate's side of JOB leases for runtimes that say when their jobs end.

For each consumer whose runtime has `Jobs`, one loop asks the runtime every
JOB_POLL_INTERVAL which of the live jobs the runtime no longer has, while the consumer
has any (it sleeps on an event otherwise), each call bounded by `timeouts.control`. A
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
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import attrs

from gpugate.core.classes import PriorityClass, ResidencyPolicy
from gpugate.core.effects import Effect, Preempt
from gpugate.core.failures import Failure, FailureClass
from gpugate.core.observation import HostObservation
from gpugate.core.residents import ResidentKey, ResidentState
from gpugate.core.state import GateCore
from gpugate.core.tickets import Demand, Lease
from gpugate.core.views import class_allows
from gpugate.gate.links import Link
from gpugate.gate.upstream import upstream_failure
from gpugate.runtimes.base import Jobs, Measured
from gpugate.store.db import MeasuredEnvelope, Store

JOB_POLL_INTERVAL = 0.5


@attrs.define
class JobWatch:
    """What the gate measures of one live job."""

    kind: ResidentKey
    scale: float
    peak: int = 0
    alone: bool = True


class JobWork:
    """The gate's side of tracked jobs (a part of `Gate`)."""

    core: GateCore
    clock: Callable[[], float]
    links: dict[str, Link]
    store: Store | None
    _measured: dict[ResidentKey, int]
    _measured_scale: dict[ResidentKey, float]
    _job_watches: dict[int, JobWatch]

    if TYPE_CHECKING:  # Gate provides these

        def _apply(self, effects: Sequence[Effect], *, timers: bool = True) -> None: ...

        def loop_failed(self, loop: str, failure: Failure) -> None: ...

        def report(self, failure: Failure) -> None: ...

        def jobs(self, consumer: str) -> list[Lease]: ...

        def job_finished(self, consumer: str, job: int | str, *, failed: bool = False) -> None: ...

    def measured_job(self, kind: ResidentKey) -> Measured | None:
        """The peak measured for jobs of this kind, if any."""
        nbytes = self._measured.get(kind)
        return None if nbytes is None else Measured(nbytes, self._measured_scale.get(kind))

    def ceiling(self, consumer: str, gpu: int, priority: PriorityClass) -> int | None:
        """The most the card could ever give one consumer's demand of class `priority`:
        total − reserved − reserve − external − memory held that no resident or lease
        explains (others' and its own) − residents it may never evict (an `always_warm`
        process, a higher class)."""
        budget = self.core.budget(gpu)
        if budget is None:
            return None
        held = sum(max(0, u.committed - u.resident - u.pending) for u in budget.consumers)
        probe = Demand(
            ResidentKey(consumer, ""), gpu, 0, priority, priority, ResidencyPolicy.KEEP_WARM, None
        )
        kept = sum(
            r.bytes
            for r in self.core.residents(gpu)
            if r.state is not ResidentState.UNLOADING and not class_allows(r, probe)
        )
        room = budget.total - budget.reserved - budget.reserve - budget.external_total
        return max(0, room - held - kept)

    def watch_job(self, lease: Lease, kind: ResidentKey, scale: float) -> None:
        """Measure a job of `kind` from now to its end."""
        others = [x for x in self.jobs(kind.consumer) if x.id != lease.id]
        self._job_watches[lease.id] = JobWatch(kind, scale, alone=not others)
        for other in others:
            watch = self._job_watches.get(other.id)
            if watch is not None:
                watch.alone = False
        link = self.links.get(kind.consumer)
        if link is not None:
            link.jobs_live.set()

    def job_ended(self, lease_id: int, *, failed: bool) -> None:
        """Keep the peak of a job that ran alone and well as its kind's measured envelope."""
        watch = self._job_watches.pop(lease_id, None)
        if watch is None or failed or not watch.alone or watch.peak <= 0:
            return
        self._measured[watch.kind] = watch.peak
        self._measured_scale[watch.kind] = watch.scale
        if self.store is not None:
            kind = watch.kind
            envelope = MeasuredEnvelope(kind.consumer, kind.model, kind.options, watch.peak)
            self.store.record_envelope(attrs.evolve(envelope, scale=watch.scale))

    def observe_jobs(self, sample: HostObservation) -> None:
        """Peaks of live jobs; the idle memory of runtimes that unload to an idle context."""
        if sample.error is not None:
            return
        for link in self.links.values():
            name = link.consumer.name
            device = sample.device(link.consumer.cards[0])
            if device is None:
                continue
            held = device.managed.get(name, 0)
            live = self.jobs(name) if link.runtime.jobs is not None else []
            for lease in live:
                watch = self._job_watches.get(lease.id)
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

    def job_names(self, consumer: str) -> frozenset[str]:
        """The runtime's names of the consumer's live jobs."""
        names: set[str] = set()
        for (owner, _), pool in self.core.jobs.by_consumer.items():
            if owner == consumer:
                names.update(pool.names)
        return frozenset(names)

    def end_jobs(self, link: Link, failure: Failure) -> None:
        """Every live job of the consumer is lost (its runtime died)."""
        name = link.consumer.name
        lost = self.jobs(name)
        if not lost:
            return
        self.report(failure)
        for lease in lost:
            self.job_finished(name, lease.id, failed=True)
        link.seen_holding = False

    def preempted(self, effect: Preempt, failure: Failure | None) -> None:
        """The runtime was asked to stop the jobs (`failure`: it could not be)."""
        now = self.clock()
        before = {x.id: x for x in self.jobs(effect.consumer) if x.gpu == effect.gpu}
        self._apply(
            self.core.preempted(effect.consumer, effect.gpu, effect.jobs, now, failure=failure)
        )
        for lease_id, lease in before.items():
            if self.core.lease(lease_id) is None:
                self.job_ended(lease_id, failed=True)
                if self.store is not None:
                    self.store.record_lease(lease, now - lease.granted, "preempted")

    async def _job_loop(self, link: Link, jobs: Jobs) -> None:
        name = link.consumer.name
        while True:
            if not self.jobs(name):
                link.seen_holding = False
                link.jobs_live.clear()
                await link.jobs_live.wait()
                continue
            await self._track_once(link, jobs)
            await asyncio.sleep(JOB_POLL_INTERVAL)

    async def _track_once(self, link: Link, jobs: Jobs) -> None:
        name = link.consumer.name
        gpu = link.consumer.cards[0]
        observation = self.core.observation(gpu)
        if link.seen_holding and observation is not None and observation.managed.get(name, 0) == 0:
            message = (
                f"RUNTIME_CRASH: {name}'s processes no longer hold GPU memory; its jobs are lost"
            )
            failure = Failure(FailureClass.RUNTIME_CRASH, message, consumer=name, gpu=gpu)
            self.end_jobs(link, failure)
            return
        assert link.session is not None
        try:
            async with asyncio.timeout(link.consumer.timeouts.control):
                ends = await jobs.track_jobs(link.session, self.job_names(name))
        except Exception as exc:
            failure = upstream_failure(link.consumer, exc, f"cannot learn how {name}'s jobs went")
            if failure.failure_class is FailureClass.RUNTIME_CRASH:
                message = f"{failure.message}; its jobs are lost"
                self.end_jobs(link, attrs.evolve(failure, message=message))
            else:
                self.loop_failed(f"jobs-{name}", failure)
            return
        for end in ends:
            self.job_finished(name, end.job, failed=end.failed)

    def start_job_loops(self, spawn: Callable[..., None]) -> None:
        for link in self.links.values():
            jobs = link.runtime.jobs
            if jobs is not None:
                spawn(self._job_loop(link, jobs), f"jobs-{link.consumer.name}")
