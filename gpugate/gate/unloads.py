"""Unloads, verified: ask the runtime, then watch NVML until the bytes come back.

A runtime may answer an unload before the process holding the memory has exited, and
NVML can lag behind the exit; a grant made on the strength of the answer alone would land
on memory that is still taken. So after asking (the runtime's `Residents.evict`), the gate
samples NVML quickly until the device's free memory rose by its reclaim rule (a
fraction of the resident's bytes), or
until the consumer's usage is what its other residents explain without external use
having grown meanwhile (the runner was gone before the gate asked), or the reclaim
timeout passes (GPU_MEMORY_NOT_RECLAIMED). Free memory, not per-process attribution,
is the measure: a dying process can drop out of the process list, and so out of its
consumer's row, before the driver has its memory back. A runtime that lists what it holds
may still list the model after its memory is back (it drops a runner once it has reaped
it): the unload ends only once its listing no longer names the model, so that no listing
meanwhile takes it for a model loaded behind the gate's back.

Unloads on one GPU run one at a time. Free memory is a figure for the whole card: two
unloads measured against the same starting point would each take the other's returned
bytes for their own, and a runner still holding its memory would be booked as gone.

The request to the runtime is bounded by the consumer's control timeout; one that fails
(refused, timed out, answered nonsense) is reported with its class, not as memory that
did not come back.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Protocol

from gpugate.core.effects import Preempt, Sleep, Stop, Unload
from gpugate.core.failures import Failure, FailureClass
from gpugate.core.lifecycle import LifeReport
from gpugate.core.observation import GpuObservation, HostObservation
from gpugate.core.residents import ResidentKey, ResidentState
from gpugate.core.state import GateCore
from gpugate.core.tickets import Demand
from gpugate.gate.link import Link
from gpugate.gate.upstream import upstream_failure
from gpugate.gpu.sampler import Sampler
from gpugate.runtimes.base import Inventory, Jobs, NotSupported

log = logging.getLogger("gpugate.unloads")

POLL_INTERVAL = 0.1
"""The longest pause between two samples while an unload waits for its bytes."""
FIRST_POLL = 0.005
"""The first pause: memory usually shows back within milliseconds of the answer, and the
request the unload is for waits on the sample that sees it. Each pause doubles, up to
POLL_INTERVAL, so a slow unload does not keep NVML busy."""


class UnloadReports(Protocol):
    """What the unload runner reports to the gate (the core decides what follows)."""

    def unloaded(
        self, key: ResidentKey, *, reclaimed: bool, failure: Failure | None = None
    ) -> None: ...

    def preempted(self, effect: Preempt, failure: Failure | None) -> None: ...

    def withdrawn(self, demand: Demand) -> None: ...

    def life_report(self, consumer: str, report: LifeReport, detail: str = "") -> None: ...

    def observe(self, sample: HostObservation) -> None: ...

    def want_reconcile(self, consumer: str) -> None: ...

    def loop_failed(self, loop: str, failure: Failure) -> None: ...


def stoppable(link: Link) -> Jobs:
    """The runtime's jobs, to stop one; NotSupported for a runtime that has none."""
    jobs = link.runtime.jobs
    if jobs is None:
        raise NotSupported(f"{link.consumer.name} cannot stop a job")
    return jobs


class UnloadRunner:
    """Carries out the core's Unload, Stop, Sleep and Preempt effects, and withdrawals."""

    def __init__(
        self,
        core: GateCore,
        links: dict[str, Link],
        sampler: Sampler,
        clock: Callable[[], float],
        reclaim_timeout: Callable[[], float],
        reports: UnloadReports,
    ) -> None:
        """`core` is read (what NVML and the books showed); `reclaim_timeout`: the
        configuration's, as a reload leaves it."""
        self.core = core
        self.links = links
        self.sampler = sampler
        self.clock = clock
        self.reclaim_timeout = reclaim_timeout
        self.reports = reports
        self._locks: dict[int, asyncio.Lock] = {}

    async def run(self, unload: Unload) -> None:
        reports = self.reports
        consumer = unload.key.consumer
        link = self.links.get(consumer)
        reclaimed = False
        failure: Failure | None = None
        try:
            async with self._locks.setdefault(unload.gpu, asyncio.Lock()):
                before = self.core.observation(unload.gpu)
                if link is None or link.session is None:
                    raise LookupError(f"no runtime can unload {unload.key}")
                residents = link.runtime.residents
                try:
                    async with asyncio.timeout(residents.evict_timeout()):
                        await self._evict(link, unload)
                except Exception as exc:
                    if isinstance(unload, (Stop, Sleep)):
                        reports.life_report(consumer, LifeReport.STOP_FAILED, str(exc))
                    what = f"cannot unload {unload.key.model}"
                    failure = upstream_failure(link.consumer, exc, what, model=unload.key.model)
                    reports.loop_failed(f"unload-{consumer}", failure)
                else:
                    rule = residents.reclaim_rule
                    idle = link.idle_bytes if rule.to_idle else None
                    reclaimed = await self._wait_for_reclaim(
                        unload, before, rule.recovered_fraction, idle, clear=rule.consumer_clear
                    )
                    inventory = link.runtime.inventory
                    if reclaimed and inventory is not None:
                        await self._wait_until_unlisted(link, inventory, unload.key.model)
        except Exception:
            log.exception("unload of %s failed", unload.key)
        finally:
            reports.unloaded(unload.key, reclaimed=reclaimed, failure=failure)
            reports.want_reconcile(consumer)

    async def _evict(self, link: Link, unload: Unload) -> None:
        """Ask for the memory back: the runtime unloads the model, or its lifecycle
        interface stops it (Stop) or puts it to sleep (Sleep), reported to the core."""
        lifecycle = link.runtime.lifecycle
        control = lifecycle.control if lifecycle is not None else None
        if isinstance(unload, (Stop, Sleep)) and lifecycle is not None and control is not None:
            name = link.consumer.name
            if isinstance(unload, Sleep):
                await control.sleep()
                self.reports.life_report(name, LifeReport.ASLEEP, unload.reason.value)
            else:
                await control.stop()
                lifecycle.process_ended()
                self.reports.life_report(name, LifeReport.STOPPED, unload.reason.value)
            return
        assert link.session is not None
        await link.runtime.residents.evict(link.session, unload.key.model)

    async def preempt(self, effect: Preempt) -> None:
        """Ask the runtime to stop the jobs, newest first, within one control timeout; the
        memory they leave is then evicted for the demand and confirmed like any unload."""
        reports = self.reports
        link = self.links.get(effect.consumer)
        failure: Failure | None = None
        try:
            if link is None or link.session is None:
                raise LookupError(f"no runtime can stop {effect.consumer}'s jobs")
            jobs = stoppable(link)
            async with asyncio.timeout(link.consumer.timeouts.control):
                for job in effect.jobs:
                    await jobs.preempt(link.session, job)
            # The jobs' lease ends with them: what the runtime holds from then on must be
            # what NVML shows now, not at the last periodic sample (a model loaded since
            # would be counted by nobody).
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.reclaim_timeout()):
                    reports.observe(await self.sampler.sample())
        except Exception as exc:
            if link is None:
                log.exception("preemption of %s's jobs failed", effect.consumer)
                failure = Failure(FailureClass.INVALID_OUTPUT, f"INVALID_OUTPUT: {exc}")
            else:
                what = f"cannot stop {effect.consumer}'s jobs"
                failure = upstream_failure(link.consumer, exc, what)
                reports.loop_failed(f"preempt-{effect.consumer}", failure)
        finally:
            reports.preempted(effect, failure)

    async def withdraw(self, link: Link, job: str | None, demand: Demand) -> None:
        """Ask the runtime to drop a job it accepted before its lease, which could not be
        had (or whose client left), within one control timeout, and wait (up to the reclaim
        timeout) until it no longer has it: what the job left is then given back, from what
        NVML shows (`GateCore.withdrawn`). Until then the job's memory is kept back."""
        reports = self.reports
        name = link.consumer.name
        try:
            if job is not None:
                if link.session is None:
                    raise LookupError(f"no runtime can withdraw {name}'s job {job}")
                jobs = stoppable(link)
                async with asyncio.timeout(link.consumer.timeouts.control):
                    await jobs.preempt(link.session, job)
                await self._until_dropped(link, jobs, job)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.reclaim_timeout()):
                    reports.observe(await self.sampler.sample())
        except Exception as exc:
            what = f"cannot withdraw {name}'s job {job}, accepted without a lease"
            reports.loop_failed(f"withdraw-{name}", upstream_failure(link.consumer, exc, what))
        finally:
            reports.withdrawn(demand)

    async def _until_dropped(self, link: Link, jobs: Jobs, job: str) -> None:
        """Poll the runtime until it says the job ended (a running job stops at its next
        step), within the reclaim timeout."""
        assert link.session is not None
        pause = FIRST_POLL
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self.reclaim_timeout()):
                while True:
                    async with asyncio.timeout(link.consumer.timeouts.control):
                        ended = await jobs.track_jobs(link.session, frozenset({job}))
                    if ended:
                        return
                    await asyncio.sleep(pause)
                    pause = min(pause * 2, POLL_INTERVAL)

    async def _wait_for_reclaim(
        self,
        unload: Unload,
        before: GpuObservation | None,
        fraction: float,
        idle: int | None,
        *,
        clear: bool,
    ) -> bool:
        clock = self.clock
        deadline = clock() + self.reclaim_timeout()
        pause = FIRST_POLL
        while True:
            try:
                # A read NVML never finishes must not hold the unload past its deadline.
                async with asyncio.timeout(max(0.0, deadline - clock()) + POLL_INTERVAL):
                    sample = await self.sampler.sample()
            except TimeoutError:
                return False
            self.reports.observe(sample)
            device = sample.device(unload.gpu)
            if (
                device is not None
                and sample.error is None
                and (
                    self._reclaimed(unload, before, device, fraction)
                    if idle is None
                    else self._back_to_idle(unload, device, idle)
                )
                and (not clear or self._cleared(unload, device))
            ):
                return True
            if clock() >= deadline:
                return False
            await asyncio.sleep(pause)
            pause = min(POLL_INTERVAL, pause * 2)

    async def _wait_until_unlisted(self, link: Link, inventory: Inventory, model: str) -> None:
        """Until the runtime's own listing no longer names the model, within the reclaim
        timeout. A runtime may list a runner until it has reaped its process, after its
        memory is back (until it has reaped the runner); while the unload is under way the
        books keep the resident, so such a listing is not taken for a model loaded behind
        the gate's back. A listing that fails ends the wait: NVML already said enough."""
        assert link.session is not None
        deadline = self.clock() + self.reclaim_timeout()
        pause = FIRST_POLL
        while True:
            try:
                async with asyncio.timeout(link.consumer.timeouts.control):
                    listed = await inventory.listing(link.session)
            except Exception as exc:
                log.debug("no listing to confirm the unload of %s: %s", model, exc)
                return
            if all(entry.name != model for entry in listed) or self.clock() >= deadline:
                return
            await asyncio.sleep(pause)
            pause = min(POLL_INTERVAL, pause * 2)

    def _reclaimed(
        self,
        unload: Unload,
        before: GpuObservation | None,
        now: GpuObservation,
        fraction: float,
    ) -> bool:
        target = fraction * unload.bytes
        if before is None:
            return False
        if now.free - before.free >= target:
            return True
        external_now = sum(now.external.values())
        external_before = sum(before.external.values())
        held = now.managed.get(unload.key.consumer, 0)
        return external_now <= external_before and held <= self._explained(unload) + (
            unload.bytes - target
        )

    def _back_to_idle(self, unload: Unload, now: GpuObservation, idle: int) -> bool:
        """A runtime that keeps a context: all it holds beyond that is explained otherwise.

        Its answer to the unload comes before it frees anything; the fraction rule could
        pass on the first of several models leaving, this one waits for the last."""
        held = now.managed.get(unload.key.consumer, 0)
        return held <= idle + self._explained(unload)

    def _cleared(self, unload: Unload, now: GpuObservation) -> bool:
        """The consumer holds no more than its other residents explain (its process left)."""
        return now.managed.get(unload.key.consumer, 0) <= self._explained(unload)

    def _explained(self, unload: Unload) -> int:
        """What the consumer's other residents and loading leases account for."""
        core = self.core
        held = sum(
            r.bytes
            for r in core.residents(unload.gpu)
            if r.key.consumer == unload.key.consumer
            and r.key != unload.key
            and r.state is not ResidentState.LOADING
        )
        pending = sum(
            lease.pending
            for lease in core.leases()
            if lease.key.consumer == unload.key.consumer and lease.gpu == unload.gpu
        )
        return held + pending
