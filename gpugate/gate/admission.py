"""Admission: leases for requests, jobs and explicit holds, waiting for them, and their
ends. Who ends a lease depends on its scope: a request's listener, a job's events, an
explicit lease's holder (or its ttl), a process lease's appearance in NVML."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import attrs

from gpugate.core.effects import Effect, Grant
from gpugate.core.explicit import LeaseTerms
from gpugate.core.lifecycle import LifeReport
from gpugate.core.placement import PlacementRule, Placing, place
from gpugate.core.residents import ResidentKey
from gpugate.core.scheduling import Admission
from gpugate.core.state import GateCore
from gpugate.core.tickets import Demand, Lease, LeaseScope, Started
from gpugate.gate.events import EventHub
from gpugate.gate.links import GateFailure
from gpugate.logs import OncePerInterval
from gpugate.store.db import Store

placed = OncePerInterval(logging.getLogger("gpugate.placement"), 60.0)


class AdmissionWork:
    """The gate's side of leases (a part of `Gate`)."""

    core: GateCore
    clock: Callable[[], float]
    store: Store | None
    events: EventHub
    _waiters: dict[int, asyncio.Future[Lease]]

    if TYPE_CHECKING:  # Gate provides these

        def _apply(self, effects: Sequence[Effect], *, timers: bool = True) -> None: ...

        def _deadline(self, at: float | None) -> None: ...

        def watch_job(self, lease: Lease, kind: ResidentKey, scale: float) -> None: ...

        def job_ended(self, lease_id: int, *, failed: bool) -> None: ...

    async def acquire(self, demand: Demand) -> Lease:
        """Wait for a lease for this demand; raises GateFailure when it cannot have one.

        A REQUEST lease is the caller's to release; a JOB lease ends with its job
        (`job_finished`), a PROCESS lease when NVML shows its process's memory.
        """
        now = self.clock()
        # The common case: a model already resident. No planner pass, no effects, no
        # timer (its resident is busy now, so it has no expiry to wait for).
        lease = self.core.reuse.grant(demand, now)
        if lease is not None:
            self.events.granted(lease)
            return lease
        admission = self.core.submit(demand, now)
        if admission.lease is not None:
            self._apply(admission.effects, timers=admission.lease.pending > 0)
            return admission.lease
        return await self._wait(admission)

    async def acquire_on(
        self,
        demand: Demand,
        gpus: Sequence[int],
        *,
        placing: Placing = Placing.GATE,
        rule: PlacementRule | None = None,
    ) -> tuple[Lease, ...]:
        """Leases for a demand that may go to any of `gpus`: one, on the GPU the placement
        chooses, or one per GPU a split load spans (acquired in GPU order; all or none)."""
        leases: list[Lease] = []
        try:
            for part in self._parts(demand, gpus, placing, rule):
                leases.append(await self.acquire(part))
        except BaseException:
            if leases:
                self.release_all(leases, failed=True)
            raise
        return tuple(leases)

    def lease_now_on(
        self,
        demand: Demand,
        gpus: Sequence[int],
        *,
        placing: Placing = Placing.GATE,
        rule: PlacementRule | None = None,
    ) -> tuple[Lease, ...] | None:
        """As `acquire_on`, but only from memory no waiting ticket keeps back and evicting
        nobody: the leases now, or None (nothing queued, evicted or held for it). Raises
        GateFailure for what fails whatever the memory (a draining consumer, stale samples)."""
        leases: list[Lease] = []
        try:
            for part in self._parts(demand, gpus, placing, rule):
                lease = self._lease_now(part)
                if lease is None:
                    if leases:
                        self.release_all(leases, failed=True)
                    return None
                leases.append(lease)
        except GateFailure:
            if leases:
                self.release_all(leases, failed=True)
            raise
        return tuple(leases)

    def _lease_now(self, demand: Demand) -> Lease | None:
        now = self.clock()
        lease = self.core.reuse.grant(demand, now)
        if lease is not None:
            self.events.granted(lease)
            return lease
        admission = self.core.submit(demand, now, at_once=True)
        self._apply(admission.effects)
        if admission.failure is not None:
            raise GateFailure(admission.failure)
        return admission.lease

    def _parts(
        self, demand: Demand, gpus: Sequence[int], placing: Placing, rule: PlacementRule | None
    ) -> list[Demand]:
        """The demand on the GPU the placement chooses, or its parts on the GPUs a split
        load spans, in GPU order."""
        if len(gpus) <= 1:
            gpu = gpus[0] if gpus else demand.gpu
            return [demand if gpu == demand.gpu else attrs.evolve(demand, gpu=gpu)]
        placement = place(self.core, demand, gpus, self.clock(), placing=placing, rule=rule)
        if placement.split and placement.predicted:
            # Said once a minute per model: the runtime splits it, the gate leases each part.
            placed.log(
                logging.INFO,
                str(demand.key),
                "%s: leased on GPUs %s: %s",
                demand.key,
                ", ".join(str(s.gpu) for s in placement.shares),
                placement.why,
            )
        return list(placement.demands(demand))

    def early_start(self, consumer: str, gpus: Sequence[int]) -> Started:
        """The mark of a job of `consumer` about to go up before its lease (`Demand.started`):
        what the last samples show of the consumer beyond the books on each of `gpus`, which
        the job's own early allocations will add to."""
        rows = self.core.telemetry.unexplained
        return Started(tuple((gpu, rows.get(gpu, {}).get(consumer, 0)) for gpu in gpus))

    async def hold(self, terms: LeaseTerms) -> Lease:
        """Wait for an explicit lease; raises GateFailure when it cannot have one.

        A caller that goes away while waiting leaves no ticket behind, and a grant that
        finds it gone is released at once (as for a request).
        """
        admission = self.core.ask(terms, self.clock())
        if admission.lease is not None:
            self._apply(admission.effects)
            return admission.lease
        return await self._wait(admission)

    async def _wait(self, admission: Admission) -> Lease:
        future: asyncio.Future[Lease] | None = None
        if admission.waiting:
            future = asyncio.get_running_loop().create_future()
            self._waiters[admission.ticket_id] = future
        self._apply(admission.effects)
        if admission.failure is not None:
            raise GateFailure(admission.failure)
        assert future is not None
        try:
            return await future
        except asyncio.CancelledError:
            self._waiters.pop(admission.ticket_id, None)
            if future.done() and not future.cancelled() and future.exception() is None:
                self.release(future.result(), failed=True)
            else:
                self._apply(self.core.cancel(admission.ticket_id, self.clock()))
            raise

    def loaded(self, lease: Lease) -> None:
        """The runtime started answering the lease's request: its model is loaded."""
        if lease.pending:
            self._apply(self.core.loaded(lease.id, self.clock()))

    def process_ready(self, lease: Lease) -> None:
        """The process started under `lease` answers: it is resident now."""
        self._apply(self.core.process_ready(lease.id, self.clock()))

    def start_process(self, lease: Lease) -> None:
        """The runtime's PROCESS lease is held: the core starts or wakes it (an effect)."""
        self._apply(self.core.start(lease.key.consumer, lease.id, self.clock()))

    def life_report(self, consumer: str, report: LifeReport, detail: str = "") -> None:
        """What the lifecycle interface saw of the runtime (started, failed, stopped, ...)."""
        self._apply(self.core.reported(consumer, report, self.clock(), detail))

    def release_all(self, leases: Sequence[Lease], *, failed: bool = False) -> None:
        """A request's leases are over together (a split load's parts: `GateCore.release_all`)."""
        if len(leases) == 1:
            self.release(leases[0], failed=failed)
            return
        now = self.clock()
        self._apply(self.core.release_all([lease.id for lease in leases], now, failed=failed))
        for lease in leases:
            self._record(lease, now, failed)

    def release(self, lease: Lease, *, failed: bool = False) -> None:
        """The lease's request is over."""
        now = self.clock()
        resident = self.core.reuse.release(lease, now)
        if resident is None:
            self._apply(self.core.release(lease.id, now, failed=failed))
        else:
            # Nothing to plan or unload: the one deadline it can bring is its resident's.
            self.events.released(lease, now, failed)
            self._deadline(resident.expires_at())
        self._record(lease, now, failed)

    def _record(self, lease: Lease, now: float, failed: bool) -> None:
        if self.store is not None:
            self.store.record_lease(lease, now - lease.granted, "failed" if failed else "done")

    # -- jobs --------------------------------------------------------------------------------

    def job_started(
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
            self.core.job_started(lease.id, job)
        if kind is not None:
            self.watch_job(lease, kind, scale)

    def job_finished(self, consumer: str, job: int | str, *, failed: bool = False) -> None:
        """A job finished, failed, was interrupted or deleted (by lease id or its name: a
        name the runtime no longer has ends every job it named)."""
        self._job_finished(consumer, job, failed=failed)
        while isinstance(job, str) and self.core.jobs.find(consumer, job) is not None:
            self._job_finished(consumer, job, failed=failed)

    def _job_finished(self, consumer: str, job: int | str, *, failed: bool) -> None:
        now = self.clock()
        job_id = self.core.jobs.find(consumer, job)
        lease = None if job_id is None else self.core.lease(job_id)
        self._apply(self.core.job_done(consumer, job, now, failed=failed))
        if job_id is not None:
            self.job_ended(job_id, failed=failed)
        if lease is not None and self.store is not None:
            self.store.record_lease(lease, now - lease.granted, "failed" if failed else "done")

    def jobs(self, consumer: str) -> list[Lease]:
        """The consumer's live jobs' leases, by id."""
        return sorted(
            (x for x in self.core.leases() if x.job_of is not None and x.key.consumer == consumer),
            key=lambda x: x.id,
        )

    @staticmethod
    def released_by_caller(lease: Lease) -> bool:
        """Whether the caller that acquired a lease ends it (a request's), or an event does.

        A PROCESS lease granted on a resident already there carries no bytes for NVML to
        show: its caller ends it too."""
        if lease.scope is LeaseScope.PROCESS:
            return not lease.pending
        return lease.scope is LeaseScope.REQUEST

    def _wake(self, grant: Grant) -> None:
        future = self._waiters.pop(grant.ticket_id, None)
        if future is None or future.done():
            # Its client is gone: the lease ends before it began.
            self._apply(self.core.release(grant.lease.id, self.clock(), failed=True))
            return
        future.set_result(grant.lease)

    def renew(self, lease_id: int, longest: float | None = None) -> Lease | None:
        """Extend an explicit lease by its ttl, or by `longest` when that is shorter (the
        most allowed now); None when it is not held (any more)."""
        self._apply(self.core.renew(lease_id, self.clock(), longest))
        lease = self.core.lease(lease_id)
        return lease if lease is not None and lease.expires_at is not None else None

    def explicit_leases(self) -> list[Lease]:
        """The explicit leases held now, by id."""
        return sorted(
            (x for x in self.core.leases() if x.expires_at is not None), key=lambda x: x.id
        )
