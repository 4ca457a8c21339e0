"""What the gate knows about a GPU from NVML, after attributing processes to owners."""

from __future__ import annotations

import enum
from collections.abc import Mapping

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
        return _sum_by(p for p in self.processes if p.owner.managed)

    @property
    def external(self) -> Mapping[str, int]:
        """Bytes per external service, plus `unattributed` (used − Σ processes)."""
        rows = dict(_sum_by(p for p in self.processes if not p.owner.managed))
        attributed = sum(p.used or 0 for p in self.processes)
        remainder = max(0, self.used - attributed)
        if remainder:
            rows[UNATTRIBUTED] = rows.get(UNATTRIBUTED, 0) + remainder
        return rows

    @property
    def unattributed(self) -> int:
        return self.external.get(UNATTRIBUTED, 0)


def _sum_by(processes: object) -> dict[str, int]:
    rows: dict[str, int] = {}
    for p in processes:  # type: ignore[attr-defined]
        rows[p.owner.name] = rows.get(p.owner.name, 0) + (p.used or 0)
    return rows


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
