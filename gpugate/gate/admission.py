"""Admission: leases for requests, jobs and explicit holds, waiting for them, and their
ends. Who ends a lease depends on its scope: a request's listener, a job's events (jobs.py),
an explicit lease's holder (or its ttl), a process lease's appearance in NVML.

Every decision is the core's, made in one synchronous call; what it decides goes back to
the gate as effects (`LeaseOwner.apply`). A waiting caller holds a future the gate's
`Grant` or `Reject` resolves (`granted`, `rejected`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, Protocol

import attrs

from gpugate.core.effects import Effect, Grant, Reject
from gpugate.core.explicit import LeaseTerms
from gpugate.core.placement import PlacementRule, Placing, place
from gpugate.core.scheduling import Admission
from gpugate.core.state import GateCore
from gpugate.core.tickets import Demand, Lease, LeaseScope, Started
from gpugate.gate.events import EventHub
from gpugate.gate.failure import GateFailure
from gpugate.logs import OncePerInterval
from gpugate.store.db import Store

placed = OncePerInterval(logging.getLogger("gpugate.placement"), 60.0)


async def _ready(lease: Lease) -> Lease:
    return lease


class LeaseOwner(Protocol):
    """Where the core's decisions about leases go: the gate carries out their effects and
    keeps its one timer at the earliest deadline."""

    def apply(self, effects: Sequence[Effect], *, timers: bool = True) -> None: ...

    def deadline(self, at: float | None) -> None: ...


class Leases:
    """The gate's leases: acquired (waiting when they must), held and released."""

    def __init__(
        self,
        core: GateCore,
        clock: Callable[[], float],
        events: EventHub,
        store: Store | None,
        owner: LeaseOwner,
    ) -> None:
        self.core = core
        self.clock = clock
        self.events = events
        self.store = store
        self.owner = owner
        self._waiters: dict[int, asyncio.Future[Lease]] = {}
        """Callers waiting for a ticket's grant, by ticket id."""

    async def acquire(self, demand: Demand) -> Lease:
        """Wait for a lease for this demand; raises GateFailure when it cannot have one.

        A REQUEST lease is the caller's to release; a JOB lease ends with its job
        (`JobWatch.finished`), a PROCESS lease when NVML shows its process's memory.
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
            self.owner.apply(admission.effects, timers=admission.lease.pending > 0)
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
        self.owner.apply(admission.effects)
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
            self.owner.apply(admission.effects)
            return admission.lease
        return await self._wait(admission)

    def follow(self, admission: Admission) -> Coroutine[Any, Any, Lease]:
        """The lease of a demand the core already admitted (a rewarm, `gpugate.core.rewarm`),
        to be awaited later: its effects are carried out and its waiter set now, so a grant
        that comes before the caller awaits is not taken for one nobody waits on. Raises
        GateFailure now for a demand the core refused."""
        if admission.lease is not None:
            self.owner.apply(admission.effects)
            return _ready(admission.lease)
        return self._waited(admission, self._register(admission))

    async def _wait(self, admission: Admission) -> Lease:
        return await self._waited(admission, self._register(admission))

    def _register(self, admission: Admission) -> asyncio.Future[Lease]:
        future: asyncio.Future[Lease] | None = None
        if admission.waiting:
            future = asyncio.get_running_loop().create_future()
            self._waiters[admission.ticket_id] = future
        self.owner.apply(admission.effects)
        if admission.failure is not None:
            raise GateFailure(admission.failure)
        assert future is not None
        return future

    async def _waited(self, admission: Admission, future: asyncio.Future[Lease]) -> Lease:
        try:
            return await future
        except asyncio.CancelledError:
            self._waiters.pop(admission.ticket_id, None)
            if future.done() and not future.cancelled() and future.exception() is None:
                self.release(future.result(), failed=True)
            else:
                self.owner.apply(self.core.cancel(admission.ticket_id, self.clock()))
            raise

    def loaded(self, lease: Lease) -> None:
        """The runtime started answering the lease's request: its model is loaded."""
        if lease.pending:
            self.owner.apply(self.core.loaded(lease.id, self.clock()))

    def release_all(self, leases: Sequence[Lease], *, failed: bool = False) -> None:
        """A request's leases are over together (a split load's parts: `GateCore.release_all`)."""
        if len(leases) == 1:
            self.release(leases[0], failed=failed)
            return
        now = self.clock()
        self.owner.apply(self.core.release_all([lease.id for lease in leases], now, failed=failed))
        for lease in leases:
            self._record(lease, now, failed)

    def release(self, lease: Lease, *, failed: bool = False) -> None:
        """The lease's request is over."""
        now = self.clock()
        resident = self.core.reuse.release(lease, now)
        if resident is None:
            self.owner.apply(self.core.release(lease.id, now, failed=failed))
        else:
            # Nothing to plan or unload: the one deadline it can bring is its resident's.
            self.events.released(lease, now, failed)
            self.owner.deadline(resident.expires_at())
        self._record(lease, now, failed)

    def _record(self, lease: Lease, now: float, failed: bool) -> None:
        if self.store is not None:
            self.store.record_lease(lease, now - lease.granted, "failed" if failed else "done")

    @staticmethod
    def released_by_caller(lease: Lease) -> bool:
        """Whether the caller that acquired a lease ends it (a request's), or an event does.

        A PROCESS lease granted on a resident already there carries no bytes for NVML to
        show: its caller ends it too."""
        if lease.scope is LeaseScope.PROCESS:
            return not lease.pending
        return lease.scope is LeaseScope.REQUEST

    def granted(self, grant: Grant) -> None:
        """The core granted a waiting ticket: its caller has its lease."""
        future = self._waiters.pop(grant.ticket_id, None)
        if future is None or future.done():
            # Its client is gone: the lease ends before it began.
            self.owner.apply(self.core.release(grant.lease.id, self.clock(), failed=True))
            return
        future.set_result(grant.lease)

    def rejected(self, reject: Reject) -> None:
        """The core failed a waiting ticket: its caller is told why."""
        future = self._waiters.pop(reject.ticket_id, None)
        if future is not None and not future.done():
            future.set_exception(GateFailure(reject.failure))

    def close(self) -> None:
        """The gate stops: nobody waits any more."""
        for future in self._waiters.values():
            if not future.done():
                future.cancel()

    def renew(self, lease_id: int, longest: float | None = None) -> Lease | None:
        """Extend an explicit lease by its ttl, or by `longest` when that is shorter (the
        most allowed now); None when it is not held (any more)."""
        self.owner.apply(self.core.renew(lease_id, self.clock(), longest))
        lease = self.core.lease(lease_id)
        return lease if lease is not None and lease.expires_at is not None else None

    def explicit_leases(self) -> list[Lease]:
        """The explicit leases held now, by id."""
        return sorted(
            (x for x in self.core.leases() if x.expires_at is not None), key=lambda x: x.id
        )
