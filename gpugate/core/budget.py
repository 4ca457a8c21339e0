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

from gpugate.core.observation import OTHER, UNATTRIBUTED, GpuObservation
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
    """Unattributed (or unclaimed) bytes taken to be unloading runners' memory on its way
    back."""

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


@attrs.define
class GpuUsage:
    """What the books hold on one GPU, summed per consumer: what a budget is computed from.

    Kept up to date change by change by the books, so a budget costs the same with 200
    residents as with two.
    """

    resident: dict[str, int] = attrs.field(factory=dict)
    """Bytes of residents (a loading one counts 0: its lease counts them)."""
    residents: dict[str, int] = attrs.field(factory=dict)
    """How many residents (a consumer with any gets a row, even at 0 bytes)."""
    unloading: dict[str, int] = attrs.field(factory=dict)
    pending: dict[str, int] = attrs.field(factory=dict)

    def count_resident(self, resident: Resident, sign: int) -> None:
        """Add (sign 1) or take away (sign -1) one resident."""
        consumer = resident.key.consumer
        count = self.residents.get(consumer, 0) + sign
        if count:
            self.residents[consumer] = count
            self.resident[consumer] = self.resident.get(consumer, 0) + sign * resident_bytes(
                resident
            )
        else:
            del self.residents[consumer]
            del self.resident[consumer]
        if resident.state is ResidentState.UNLOADING:
            left = self.unloading.get(consumer, 0) + sign * resident.bytes
            if left:
                self.unloading[consumer] = left
            else:
                self.unloading.pop(consumer, None)

    def count_lease(self, lease: Lease, sign: int) -> None:
        """Add (sign 1) or take away (sign -1) one lease's pending bytes."""
        if lease.pending:
            consumer = lease.key.consumer
            left = self.pending.get(consumer, 0) + sign * lease.pending
            if left:
                self.pending[consumer] = left
            else:
                del self.pending[consumer]


def usage_of(gpu: int, residents: Iterable[Resident], leases: Iterable[Lease]) -> GpuUsage:
    """The sums of one GPU, counted from scratch."""
    usage = GpuUsage()
    for r in residents:
        if r.gpu == gpu:
            usage.count_resident(r, 1)
    for lease in leases:
        if lease.gpu == gpu:
            usage.count_lease(lease, 1)
    return usage


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
    return budget_of(
        observation,
        usage_of(observation.index, residents, leases),
        sampled_at=sampled_at,
        reserve=reserve,
        unexplained=unexplained,
        consumers=consumers,
    )


def budget_of(
    observation: GpuObservation,
    usage: GpuUsage,
    *,
    sampled_at: float,
    reserve: int,
    unexplained: Mapping[str, int] | None = None,
    consumers: Iterable[str] = (),
) -> GpuBudget:
    """The budget rows of one GPU from the books' sums for it."""
    resident = usage.resident
    unloading = usage.unloading
    pending = usage.pending
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
    # counts them (or, exited before its /proc entry was read, a process nobody claims).
    # Unattributed, then unclaimed, bytes up to what unloading residents no longer show
    # are those bytes on their way back, already counted once.
    # A sum below 0 is a drift in the books' carried sums, never bytes on their way back.
    vanished = sum(
        max(0, min(nbytes, resident.get(name, 0) - observed.get(name, 0)))
        for name, nbytes in unloading.items()
    )
    outside = dict(observation.external)
    reclaiming = 0
    for row in (UNATTRIBUTED, OTHER):
        taken = min(outside.get(row, 0), vanished - reclaiming)
        if taken > 0:
            reclaiming += taken
            outside[row] -= taken
            if not outside[row]:
                del outside[row]
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
    return unexplained_of(observation, usage_of(observation.index, residents, leases))


def unexplained_of(observation: GpuObservation, usage: GpuUsage) -> dict[str, int]:
    """Per consumer, what the sample shows beyond the books' sums (never negative)."""
    budget = budget_of(observation, usage, sampled_at=0.0, reserve=0)
    return {
        row.name: row.observed - row.resident - row.pending
        for row in budget.consumers
        if row.observed > row.resident + row.pending
    }
