"""The books: residents, leases and unloads in progress — everything that holds VRAM."""

from __future__ import annotations

import itertools
from typing import Protocol

from gpugate.core.budget import GpuUsage, usage_of
from gpugate.core.effects import Effect, Event, EventKind, Sleep, Stop, Unload, UnloadReason
from gpugate.core.lifecycle import Eviction, Lifecycles, LifeState
from gpugate.core.residents import ANY_OPTIONS, Resident, ResidentKey, ResidentState
from gpugate.core.table import ResidentTable
from gpugate.core.tickets import Demand, Lease, LeaseScope


class JobOpener(Protocol):
    """Opens a job-scope lease within its consumer's job lease (gpugate.core.job_leases)."""

    def open(self, job_id: int, demand: Demand, now: float, arrived: float) -> Lease: ...


def loading_resident(demand: Demand, nbytes: int, now: float) -> Resident:
    """The resident a granted load makes: loading, busy with its request, `nbytes` for
    planning (what it will free one day)."""
    return Resident(
        key=demand.key,
        gpu=demand.gpu,
        bytes=nbytes,
        priority=demand.resident_priority,
        policy=demand.policy,
        idle_ttl=demand.idle_ttl,
        state=ResidentState.LOADING,
        in_flight=1,
        last_used=now,
        changed_at=now,
        reload_seconds=demand.reload_seconds,
    )


EVICTIONS: dict[Eviction, type[Unload]] = {
    Eviction.UNLOAD: Unload,
    Eviction.STOP: Stop,
    Eviction.SLEEP: Sleep,
}


class Books:
    """Mutable ledger owned by the core.

    `stamp(gpu)` changes with every change a GPU's queue plans depend on (`version` with
    every change at all); `residents_version`
    only when residents or leases change (not when a ticket joins or leaves the queue).
    Every change to what holds memory is followed by `touch()`; the per-GPU sums a budget
    is computed from are recounted after a change made elsewhere, and carried forward
    by the changes the books make themselves.
    """

    def __init__(self) -> None:
        self.residents: ResidentTable = ResidentTable()
        self.leases: dict[int, Lease] = {}
        self.unloads: dict[ResidentKey, Unload] = {}
        self.unloaded_at: dict[tuple[str, str], float] = {}
        """(consumer, model) → when its last unload finished: a listing asked before that
        may still name it (the runtime reaps a runner after its memory is back)."""
        self.residents_version = 0
        self._shared = 0
        """Changes not tied to one GPU (any change to what holds memory is taken as such)."""
        self._by_gpu: dict[int, int] = {}
        """Changes to one GPU's queue or budget only."""
        self._ids = itertools.count(1)
        self.lives = Lifecycles()
        """The runtimes with a lifecycle: an eviction of theirs is a stop or a sleep."""
        self.jobs: JobOpener | None = None
        """Where job-scope leases are opened (the core's job book, set by its owner)."""
        self._usage: dict[int, GpuUsage] = {}
        self._usage_at = -1
        """The `residents_version` the sums are right for."""
        self.switched_out: dict[int, Resident] = {}
        """A switch's lease id → the resident its grant took out of the books (the model
        the runtime frees for it), kept until the switch is answered."""

    def new_id(self) -> int:
        """An id for a ticket, and the lease it becomes."""
        return next(self._ids)

    def touch(self, *, residents: bool = True, gpu: int | None = None) -> None:
        """Record a change: to the queue or budget only (of `gpu`, when it concerns only
        that GPU), or (the default) to what holds memory."""
        if residents:
            self.residents_version += 1
        if residents or gpu is None:
            self._shared += 1
        else:
            self._by_gpu[gpu] = self._by_gpu.get(gpu, 0) + 1

    @property
    def version(self) -> int:
        """How many changes the books have seen (every `touch`, whatever it concerned)."""
        return self._shared + sum(self._by_gpu.values())

    def stamp(self, gpu: int) -> tuple[int, int]:
        """Changes when anything a plan of `gpu`'s queue depends on changes: a change to
        another GPU's queue alone leaves it (plans of one card are not redone for another's
        arrivals)."""
        return self._shared, self._by_gpu.get(gpu, 0)

    def on_gpu(self, gpu: int) -> list[Resident]:
        return self.residents.on_gpu(gpu)

    def parts_of(self, whole: ResidentKey) -> list[Resident]:
        """The parts of a model split across GPUs (none for a model on one GPU)."""
        return self.residents.parts_of(whole)

    def usage(self, gpu: int) -> GpuUsage:
        """Per consumer, what the residents and pending leases of a GPU hold."""
        if self._usage_at != self.residents_version:
            gpus = {r.gpu for r in self.residents.values()} | {x.gpu for x in self.leases.values()}
            leases = list(self.leases.values())
            self._usage = {g: usage_of(g, self.residents.on_gpu(g), leases) for g in gpus}
            self._usage_at = self.residents_version
        return self._usage.get(gpu) or GpuUsage()

    def _counted(self) -> bool:
        """Whether the sums are right now (a change may then be carried into them)."""
        return self._usage_at == self.residents_version

    def _count(self, fresh: bool, gpu: int) -> GpuUsage | None:
        if not fresh:
            return None
        sums = self._usage.get(gpu)
        if sums is None:
            sums = self._usage[gpu] = GpuUsage()
        return sums

    def _touch_counted(self, fresh: bool) -> None:
        self.touch()
        if fresh:
            self._usage_at = self.residents_version

    def _touch_kept(self) -> None:
        """Record a change that moves no bytes: the sums stay right if they were."""
        fresh = self._usage_at == self.residents_version
        self.residents_version += 1
        self._shared += 1
        if fresh:
            self._usage_at = self.residents_version

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

    def replaced(self, demand: Demand) -> Resident | None:
        """The resident `demand` replaces, when it is still there."""
        resident = None if demand.replaces is None else self.residents.get(demand.replaces)
        return (
            resident if resident is not None and resident.state is ResidentState.RESIDENT else None
        )

    def replaced_bytes(self, demand: Demand) -> int:
        """The bytes of the resident `demand` replaces (0: none)."""
        resident = self.replaced(demand)
        return 0 if resident is None else resident.bytes

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
        if resident is not None and not needed and not demand.explicit:
            return self.lend(lease_id, demand, now, now - arrived, resident)
        gone = self.replaced(demand)
        if gone is not None:
            # The runtime frees it as it loads this one: the new lease's bytes are its place.
            del self.residents[gone.key]
            if demand.switch:
                self.switched_out[lease_id] = gone
            self.touch()
        sums = self._count(self._counted(), demand.gpu)
        appear_by = None
        if (
            demand.scope is LeaseScope.PROCESS
            and demand.appear_within is not None
            and needed
            and not demand.switch
        ):
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
        if sums is not None:
            sums.count_lease(lease, 1)
        if demand.explicit:
            # No model to load: its bytes stay pending, counted for its owner, until it ends.
            self._touch_counted(sums is not None)
            return lease
        if resident is not None:
            resident.in_flight += 1
            resident.last_used = now
            if demand.sets_ttl:
                resident.idle_ttl = demand.idle_ttl
        else:
            # A loading resident carries its lease's bytes for planning (what it will free
            # one day); the budget counts them as the lease's until the load completes.
            old = self.residents.get(demand.key)
            if sums is not None and old is not None:
                # Counted off the GPU it is on, which need not be this load's.
                self._usage.setdefault(old.gpu, GpuUsage()).count_resident(old, -1)
            self.residents[demand.key] = loading_resident(demand, needed, now)
            if sums is not None:
                sums.count_resident(self.residents[demand.key], 1)
        self._touch_counted(sums is not None)
        return lease

    def lend(
        self, lease_id: int, demand: Demand, now: float, waited: float, resident: Resident
    ) -> Lease:
        """Record a zero-byte lease on a resident that serves the demand as it is (not a
        job's, not an explicit one): it moves no bytes, so the sums stay as they are."""
        lease = Lease(lease_id, demand, now, waited, 0, False)
        self.leases[lease_id] = lease
        resident.in_flight += 1
        resident.last_used = now
        if demand.sets_ttl:
            resident.idle_ttl = demand.idle_ttl
        self._touch_kept()
        return lease

    def give_back(self, lease: Lease, resident: Resident, now: float) -> None:
        """End a zero-byte lease on `resident` (the resident `close_lease` would find for
        it) as `close_lease` does; it moves no bytes, so the sums stay as they are."""
        del self.leases[lease.id]
        resident.in_flight = max(0, resident.in_flight - 1)
        resident.last_used = now
        self._touch_kept()

    def materialise(self, lease: Lease, now: float) -> None:
        """The lease's load completed: its pending bytes become the resident's (a switch's:
        the process's, followed by NVML from here)."""
        fresh = self._counted()
        self._materialise(lease, now, self._count(fresh, lease.gpu))
        self._touch_counted(fresh)

    def _materialise(self, lease: Lease, now: float, sums: GpuUsage | None) -> None:
        resident = self.residents.get(lease.key)
        if resident is not None and resident.state is ResidentState.LOADING:
            if sums is not None:
                sums.count_resident(resident, -1)
            resident.state = ResidentState.RESIDENT
            resident.bytes = lease.pending
            resident.changed_at = now
            if lease.demand.switch:
                # The process's memory again: NVML corrects the envelope from the next sample.
                resident.tracks_observed = resident.process = True
            if sums is not None:
                sums.count_resident(resident, 1)
        if sums is not None and self.leases.get(lease.id) is lease:
            sums.count_lease(lease, -1)
        self.switched_out.pop(lease.id, None)
        lease.pending = 0

    def close_lease(
        self, lease_id: int, now: float, *, failed: bool
    ) -> tuple[Lease, Resident | None] | None:
        """Remove a lease; returns it and the resident it leaves behind (if any)."""
        fresh = self._counted()
        lease = self.leases.pop(lease_id, None)
        if lease is None:
            return None
        sums = self._count(fresh, lease.gpu)
        if sums is not None:
            sums.count_lease(lease, -1)
        resident = self.residents.get(lease.key) if lease.loads else self.reusable(lease.key)
        switched_out = self.switched_out.pop(lease.id, None)
        if lease.pending and failed and (resident is not None or switched_out is not None):
            # The load never completed: whatever it allocated is the runtime's to free.
            if resident is not None:
                resident.in_flight -= 1
                if resident.in_flight <= 0 and resident.state is ResidentState.LOADING:
                    gone = self.residents.pop(lease.key)
                    if sums is not None and gone is not None:
                        sums.count_resident(gone, -1)
            if switched_out is not None and self._switch_back(switched_out, now):
                fresh = False  # the sums are recounted with that model back
            self._touch_counted(fresh)
            return lease, None
        if lease.pending:
            self._materialise(lease, now, sums)
            self.touch()
        if resident is not None:
            resident.in_flight = max(0, resident.in_flight - 1)
            resident.last_used = now
        self._touch_counted(fresh)
        return lease, resident

    def _switch_back(self, resident: Resident, now: float) -> bool:
        """A switch did not happen (the runtime refused it, or it went unanswered): the model
        it replaced is the process's again, as the runtime keeps it (whisper-server checks
        a /load before it frees anything). Not when the process is gone since, nor where
        another model took its key. Its bytes follow NVML; it is busy with the leases
        still open on it."""
        life = self.lives.get(resident.key.consumer)
        if life is not None and life.state is not LifeState.UP:
            return False
        if resident.key in self.residents:
            return False
        resident.state = ResidentState.RESIDENT
        resident.in_flight = sum(1 for x in self.leases.values() if x.key == resident.key)
        resident.changed_at = now
        resident.tracks_observed = resident.process = True
        self.residents[resident.key] = resident
        return True

    def start_unload(
        self, resident: Resident, reason: UnloadReason, ticket_id: int | None, now: float
    ) -> Unload:
        """The resident is to be evicted: an unload, or for a runtime with a lifecycle a
        stop or a sleep (its lifecycle is stopping from now)."""
        fresh = self._counted() and self.residents.get(resident.key) is resident
        sums = self._count(fresh, resident.gpu)
        if sums is not None:
            sums.count_resident(resident, -1)
        resident.state = ResidentState.UNLOADING
        if sums is not None:
            sums.count_resident(resident, 1)
        how = EVICTIONS[self.lives.evicting(resident.key.consumer, now)]
        unload = how(resident.key, resident.gpu, resident.bytes, reason, ticket_id)
        self.unloads[resident.key] = unload
        self._touch_counted(fresh)
        return unload

    def unload_parts(
        self, resident: Resident, reason: UnloadReason, ticket_id: int | None, now: float
    ) -> list[Effect]:
        """The other parts of a split model one part of which is being evicted: the runtime
        unloads the model whole, so each part's GPU gets its bytes back (an unload and an
        event for each part not already going)."""
        if resident.key.part is None:
            return []
        effects: list[Effect] = []
        for part in self.parts_of(resident.key.whole):
            if part is resident or part.state is not ResidentState.RESIDENT:
                continue
            effects.append(self.start_unload(part, reason, ticket_id, now))
            effects.append(
                Event(
                    EventKind.EVICTION_STARTED,
                    now,
                    key=part.key,
                    gpu=part.gpu,
                    bytes=part.bytes,
                    reason=reason.value,
                    detail=f"the runtime unloads the model whole: its part on GPU "
                    f"{resident.gpu} is evicted",
                )
            )
        return effects

    def finish_unload(self, key: ResidentKey) -> tuple[Unload, Resident | None] | None:
        fresh = self._counted()
        unload = self.unloads.pop(key, None)
        if unload is None:
            return None
        resident = self.residents.get(key)
        if resident is not None and (
            resident.gpu != unload.gpu or resident.state is not ResidentState.UNLOADING
        ):
            # The key names a load of the model begun since (another card's): not what left.
            resident = None
        elif resident is not None:
            del self.residents[key]
            if fresh:
                self._usage.setdefault(resident.gpu, GpuUsage()).count_resident(resident, -1)
        self._touch_counted(fresh)
        return unload, resident
