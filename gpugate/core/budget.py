"""The VRAM budget of one GPU, computed from a sample and the gate's own books.

    schedulable = total − driver_reserved − external − Σ committed(consumer) − reserve
    committed(c) = max(observed(c), resident(c) + unexplained(c) + pending(c))

`observed` is what NVML shows for the consumer's processes. `resident` is the bytes of the
models the gate knows are loaded, `pending` the bytes of leases whose load has not
completed, and `unexplained` what the last sample showed beyond resident + pending (a
model loaded behind the gate's back, or a load larger than its envelope). Taking the max
means a model that is loading is counted once: its bytes appear in `observed` as they
arrive while the lease still counts them in full.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import attrs

from gpugate.core.observation import UNATTRIBUTED, GpuObservation
from gpugate.core.residents import Resident, ResidentState
from gpugate.core.tickets import Lease


@attrs.frozen
class ConsumerUsage:
    """One managed consumer's row on one GPU."""

    name: str
    observed: int = 0
    resident: int = 0
    pending: int = 0
    unexplained: int = 0

    @property
    def committed(self) -> int:
        return max(self.observed, self.resident + self.unexplained + self.pending)


@attrs.frozen
class ExternalUsage:
    """An external service's row (or `other`, or `unattributed`)."""

    name: str
    bytes: int


@attrs.frozen
class GpuBudget:
    """Every row of one GPU's budget. Negative `schedulable` means over-committed."""

    observation: GpuObservation
    """The sample the rows were computed from: the card's identity and NVML's figures."""
    external: tuple[ExternalUsage, ...]
    consumers: tuple[ConsumerUsage, ...]
    reserve: int
    sampled_at: float
    reclaiming: int = 0
    """Unattributed bytes taken to be unloading runners' memory on its way back."""

    @property
    def gpu(self) -> int:
        return self.observation.index

    @property
    def uuid(self) -> str:
        return self.observation.uuid

    @property
    def name(self) -> str:
        return self.observation.name

    @property
    def total(self) -> int:
        return self.observation.total

    @property
    def reserved(self) -> int:
        return self.observation.reserved

    @property
    def used(self) -> int:
        return self.observation.used

    @property
    def free(self) -> int:
        return self.observation.free

    @property
    def external_total(self) -> int:
        return sum(row.bytes for row in self.external)

    @property
    def committed_total(self) -> int:
        return sum(row.committed for row in self.consumers)

    @property
    def schedulable(self) -> int:
        return (
            self.total - self.reserved - self.external_total - self.committed_total - self.reserve
        )

    def consumer(self, name: str) -> ConsumerUsage:
        for row in self.consumers:
            if row.name == name:
                return row
        return ConsumerUsage(name)


def resident_bytes(resident: Resident) -> int:
    """Bytes a resident counts for: a loading one is still counted by its lease."""
    return 0 if resident.state is ResidentState.LOADING else resident.bytes


def compute_budget(
    observation: GpuObservation,
    *,
    sampled_at: float,
    reserve: int,
    residents: Iterable[Resident] = (),
    leases: Iterable[Lease] = (),
    unexplained: Mapping[str, int] | None = None,
    consumers: Iterable[str] = (),
) -> GpuBudget:
    """The budget rows of one GPU. Pure: the same inputs always give the same rows."""
    gpu = observation.index
    resident: dict[str, int] = {}
    unloading: dict[str, int] = {}
    for r in residents:
        if r.gpu == gpu:
            resident[r.key.consumer] = resident.get(r.key.consumer, 0) + resident_bytes(r)
            if r.state is ResidentState.UNLOADING:
                unloading[r.key.consumer] = unloading.get(r.key.consumer, 0) + r.bytes
    pending: dict[str, int] = {}
    for lease in leases:
        if lease.gpu == gpu and lease.pending:
            pending[lease.key.consumer] = pending.get(lease.key.consumer, 0) + lease.pending
    observed = observation.managed
    unexplained = unexplained or {}
    names = sorted(set(consumers) | set(observed) | set(resident) | set(pending) | set(unexplained))
    rows = tuple(
        ConsumerUsage(
            name=name,
            observed=observed.get(name, 0),
            resident=resident.get(name, 0),
            pending=pending.get(name, 0),
            unexplained=unexplained.get(name, 0),
        )
        for name in names
    )
    # A runner being unloaded can drop out of NVML's process list before the driver has
    # its memory back: for a moment its bytes are unattributed while its resident still
    # counts them. Unattributed bytes up to what unloading residents no longer show are
    # those bytes on their way back, already counted once.
    vanished = sum(
        min(nbytes, max(0, resident.get(name, 0) - observed.get(name, 0)))
        for name, nbytes in unloading.items()
    )
    outside = dict(observation.external)
    reclaiming = min(outside.get(UNATTRIBUTED, 0), vanished)
    if reclaiming:
        outside[UNATTRIBUTED] -= reclaiming
        if not outside[UNATTRIBUTED]:
            del outside[UNATTRIBUTED]
    external = tuple(
        ExternalUsage(name, nbytes)
        for name, nbytes in sorted(outside.items(), key=lambda kv: (-kv[1], kv[0]))
    )
    return GpuBudget(
        observation=observation,
        external=external,
        consumers=rows,
        reserve=reserve,
        sampled_at=sampled_at,
        reclaiming=reclaiming,
    )


def unexplained_after_sample(
    observation: GpuObservation, residents: Iterable[Resident], leases: Iterable[Lease]
) -> dict[str, int]:
    """Per consumer, what the sample shows beyond the gate's own books (never negative)."""
    budget = compute_budget(
        observation, sampled_at=0.0, reserve=0, residents=residents, leases=leases
    )
    return {
        row.name: row.observed - row.resident - row.pending
        for row in budget.consumers
        if row.observed > row.resident + row.pending
    }
