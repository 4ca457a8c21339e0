"""The books: residents, leases and unloads in progress — everything that holds VRAM."""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING

from gpugate.core.effects import Unload, UnloadReason
from gpugate.core.residents import ANY_OPTIONS, Resident, ResidentKey, ResidentState
from gpugate.core.tickets import Demand, Lease, LeaseScope

if TYPE_CHECKING:
    from gpugate.core.scopes import JobBook


class Books:
    """Mutable ledger owned by the core.

    `version` changes with every change the queue's plans depend on; `residents_version`
    only when residents or leases change (not when a ticket joins or leaves the queue).
    """

    def __init__(self) -> None:
        self.residents: dict[ResidentKey, Resident] = {}
        self.leases: dict[int, Lease] = {}
        self.unloads: dict[ResidentKey, Unload] = {}
        self.version = 0
        self.residents_version = 0
        self._ids = itertools.count(1)
        self.jobs: JobBook | None = None
        """The consumers' job leases (set by the core that owns these books)."""

    def new_id(self) -> int:
        """An id for a ticket, and the lease it becomes."""
        return next(self._ids)

    def touch(self, *, residents: bool = True) -> None:
        """Record a change: to the queue only, or (the default) to what holds memory."""
        self.version += 1
        if residents:
            self.residents_version += 1

    def on_gpu(self, gpu: int) -> list[Resident]:
        return [r for r in self.residents.values() if r.gpu == gpu]

    def leases_on(self, gpu: int) -> list[Lease]:
        return [lease for lease in self.leases.values() if lease.gpu == gpu]

    def reusable(self, key: ResidentKey) -> Resident | None:
        """The loaded resident a request with this key can use without a reload."""
        exact = self.residents.get(key)
        if exact is not None and exact.state is ResidentState.RESIDENT:
            return exact
        if key.options == "":
            loose = self.residents.get(ResidentKey(key.consumer, key.model, ANY_OPTIONS))
            if loose is not None and loose.state is ResidentState.RESIDENT:
                return loose
        return None

    def open_lease(
        self,
        lease_id: int,
        demand: Demand,
        now: float,
        arrived: float,
        needed: int,
        resident: Resident | None,
    ) -> Lease:
        """Record a granted lease; a lease for a model not resident starts its load."""
        if demand.scope is LeaseScope.JOB and self.jobs is not None:
            return self.jobs.open(lease_id, demand, now, arrived)
        appear_by = None
        if demand.scope is LeaseScope.PROCESS and demand.appear_within is not None and needed:
            appear_by = now + demand.appear_within
        lease = Lease(
            lease_id,
            demand,
            granted=now,
            waited=now - arrived,
            pending=needed,
            loads=resident is None and not demand.explicit,
            expires_at=None if demand.lease_ttl is None else now + demand.lease_ttl,
            appear_by=appear_by,
        )
        self.leases[lease_id] = lease
        if demand.explicit:
            # No model to load: its bytes stay pending, counted for its owner, until it ends.
            self.touch()
            return lease
        if resident is not None:
            resident.in_flight += 1
            resident.last_used = now
            if demand.sets_ttl:
                resident.idle_ttl = demand.idle_ttl
        else:
            # A loading resident carries its lease's bytes for planning (what it will free
            # one day); the budget counts them as the lease's until the load completes.
            self.residents[demand.key] = Resident(
                key=demand.key,
                gpu=demand.gpu,
                bytes=needed,
                priority=demand.resident_priority,
                policy=demand.policy,
                idle_ttl=demand.idle_ttl,
                state=ResidentState.LOADING,
                in_flight=1,
                last_used=now,
                changed_at=now,
                reload_seconds=demand.reload_seconds,
            )
        self.touch()
        return lease

    def materialise(self, lease: Lease, now: float) -> None:
        """The lease's load completed: its pending bytes become the resident's."""
        resident = self.residents.get(lease.key)
        if resident is not None and resident.state is ResidentState.LOADING:
            resident.state = ResidentState.RESIDENT
            resident.bytes = lease.pending
            resident.changed_at = now
        lease.pending = 0
        self.touch()

    def close_lease(
        self, lease_id: int, now: float, *, failed: bool
    ) -> tuple[Lease, Resident | None] | None:
        """Remove a lease; returns it and the resident it leaves behind (if any)."""
        lease = self.leases.pop(lease_id, None)
        if lease is None:
            return None
        resident = self.residents.get(lease.key) if lease.loads else self.reusable(lease.key)
        if lease.pending and failed and resident is not None:
            # The load never completed: whatever it allocated is the runtime's to free.
            resident.in_flight -= 1
            if resident.in_flight <= 0 and resident.state is ResidentState.LOADING:
                del self.residents[lease.key]
            self.touch()
            return lease, None
        if lease.pending:
            self.materialise(lease, now)
        if resident is not None:
            resident.in_flight = max(0, resident.in_flight - 1)
            resident.last_used = now
        self.touch()
        return lease, resident

    def start_unload(
        self, resident: Resident, reason: UnloadReason, ticket_id: int | None
    ) -> Unload:
        resident.state = ResidentState.UNLOADING
        unload = Unload(resident.key, resident.gpu, resident.bytes, reason, ticket_id)
        self.unloads[resident.key] = unload
        self.touch()
        return unload

    def finish_unload(self, key: ResidentKey) -> tuple[Unload, Resident | None] | None:
        unload = self.unloads.pop(key, None)
        if unload is None:
            return None
        resident = self.residents.pop(key, None)
        self.touch()
        return unload, resident
