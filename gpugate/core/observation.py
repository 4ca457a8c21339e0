"""What the gate knows about a GPU from NVML, after attributing processes to owners."""

from __future__ import annotations

import enum
import functools
from collections.abc import Mapping
from types import MappingProxyType

import attrs

UNATTRIBUTED = "unattributed"
"""External row for used memory that no process accounts for (used − Σ processes)."""
OTHER = "other"
"""External row for processes that match no consumer and no configured service."""


class OwnerKind(enum.Enum):
    CONSUMER = "consumer"
    """A managed runtime from consumers.yaml."""
    EXTERNAL = "external"
    """A configured external service, or `other` when nothing matched."""


@attrs.frozen
class Owner:
    kind: OwnerKind
    name: str

    @property
    def managed(self) -> bool:
        return self.kind is OwnerKind.CONSUMER


@attrs.frozen
class ProcessUsage:
    """One PID on one GPU, as NVML lists it (compute and graphics merged)."""

    pid: int
    used: int | None
    """Bytes, or None where the driver cannot tell (WDDM)."""
    owner: Owner
    name: str = ""
    kinds: str = "C"
    """"C", "G" or "CG"."""


@attrs.frozen
class GpuObservation:
    """One GPU in one sample, with memory split by owner."""

    index: int
    uuid: str
    name: str
    total: int
    reserved: int
    """Driver/firmware reserved (NVML v2; 0 when only v1 is available)."""
    used: int
    """Allocated by processes and the driver, excluding `reserved`."""
    free: int
    processes: tuple[ProcessUsage, ...] = ()
    process_fault: DriverFault | None = None
    """Set when NVML could not list this GPU's processes: `processes` is then incomplete."""

    @property
    def managed(self) -> Mapping[str, int]:
        """Bytes observed per consumer."""
        return self._by_owner.managed

    @property
    def external(self) -> Mapping[str, int]:
        """Bytes per external service, plus `unattributed` (used − Σ processes)."""
        return self._by_owner.external

    @property
    def unattributed(self) -> int:
        return self._by_owner.external.get(UNATTRIBUTED, 0)

    @functools.cached_property
    def _by_owner(self) -> _OwnerSums:
        # Summed once per observation: the budget and its readers ask for these sums
        # dozens of times per sample, over hundreds of processes on a big host.
        return _OwnerSums.of(self.processes, self.used)


@attrs.frozen
class _OwnerSums:
    """An observation's bytes by owner, read-only since every reader shares them."""

    managed: Mapping[str, int]
    external: Mapping[str, int]

    @classmethod
    def of(cls, processes: tuple[ProcessUsage, ...], used: int) -> _OwnerSums:
        managed: dict[str, int] = {}
        external: dict[str, int] = {}
        attributed = 0
        for p in processes:
            nbytes = p.used or 0
            attributed += nbytes
            rows = managed if p.owner.kind is OwnerKind.CONSUMER else external
            rows[p.owner.name] = rows.get(p.owner.name, 0) + nbytes
        remainder = max(0, used - attributed)
        if remainder:
            external[UNATTRIBUTED] = external.get(UNATTRIBUTED, 0) + remainder
        return cls(MappingProxyType(managed), MappingProxyType(external))


@attrs.frozen
class HostObservation:
    """Every GPU at one moment. `taken_at` is on the gate's monotonic clock."""

    taken_at: float
    wall_time: float
    devices: tuple[GpuObservation, ...] = ()
    driver_version: str = ""
    error: DriverFault | None = None

    def device(self, index: int) -> GpuObservation | None:
        for device in self.devices:
            if device.index == index:
                return device
        return None


@attrs.frozen
class DriverFault:
    """NVML could not be read: the class is always DRIVER_ERROR; code and name say why."""

    code: int
    name: str
    message: str
    call: str = ""
    gpu: int | None = None
    """The GPU whose call failed; None for host-wide calls (init, device count)."""
