"""Residents: models (or whole runtimes) that hold VRAM on a GPU, as the gate accounts them."""

from __future__ import annotations

import enum
from typing import NamedTuple

import attrs

from gpugate.core.classes import PriorityClass, ResidencyPolicy

ANY_OPTIONS = "*"
"""Options fingerprint of a resident whose runner options are unknown (loaded out of band)."""


class ResidentKey(NamedTuple):
    """What must match for a request to reuse a loaded model without a reload.

    For Ollama that is the model plus its runner options (num_ctx, num_gpu, ...): a request
    with other runner options makes Ollama reload the model. A tuple, because the planner
    looks keys up in sets and dicts thousands of times per queue pass.
    """

    consumer: str
    model: str
    options: str = ""
    part: int | None = None
    """A model a runtime splits across GPUs is one resident per GPU, each its part there
    (the GPU's index); None for a model on one GPU."""

    def __str__(self) -> str:
        suffix = "" if not self.options else f" [{self.options}]"
        part = "" if self.part is None else f" (part on GPU {self.part})"
        return f"{self.consumer}/{self.model}{suffix}{part}"

    @property
    def whole(self) -> ResidentKey:
        """The model this is a part of (itself for a model on one GPU)."""
        return self if self.part is None else ResidentKey(self.consumer, self.model, self.options)

    def on(self, gpu: int) -> ResidentKey:
        """The part of this model on `gpu`."""
        return ResidentKey(self.consumer, self.model, self.options, gpu)


class ResidentState(enum.Enum):
    LOADING = "loading"
    """A lease is loading it; its bytes are still counted as the lease's."""
    RESIDENT = "resident"
    UNLOADING = "unloading"
    """An unload was sent; its bytes stay counted until NVML shows them returned."""
    SUSPECT = "suspect"
    """Unloaded, but NVML never showed its bytes come back: they stay counted, and it is
    not unloaded again (that would not help) until a sample shows the memory returned."""


@attrs.define
class Resident:
    """One model in VRAM. Mutable: owned by the core state, changed only by its events."""

    key: ResidentKey
    gpu: int
    bytes: int
    priority: PriorityClass
    policy: ResidencyPolicy
    idle_ttl: float | None
    """Seconds it may stay idle before the gate unloads it; None is forever."""
    state: ResidentState = ResidentState.RESIDENT
    in_flight: int = 0
    last_used: float = 0.0
    reload_seconds: float = 1.0
    """How long reloading it takes; cheap-to-reload models are evicted first."""
    changed_at: float = 0.0
    """When it was loaded or last reconciled; a runtime listing older than this cannot drop it."""
    out_of_band: bool = False
    """Found in the runtime without a lease (e.g. loaded from loopback behind the gate)."""
    offload_reported: bool = False
    """A partial CPU offload of this load has been reported (once per load)."""
    tracks_observed: bool = False
    """Known from NVML only (a process, or what a runtime that cannot list kept after its
    jobs): its bytes follow what NVML shows for its consumer, and it goes when they do."""
    process: bool = False
    """Its process's memory: it is there while the process runs. Until NVML has shown any
    of it (a process that allocates nothing on the GPU) it stays at what NVML shows; it goes
    when the gate says the process ended, or when NVML stops showing memory it showed."""
    shown: bool = False
    """NVML has shown some of a process resident's memory."""

    @property
    def idle(self) -> bool:
        return self.in_flight == 0 and self.state is ResidentState.RESIDENT

    def expires_at(self) -> float | None:
        """When the gate will unload it for idleness (None: never, or not idle)."""
        if not self.idle or self.idle_ttl is None:
            return None
        return self.last_used + self.idle_ttl

    def reload_cost_per_byte(self) -> float:
        return self.reload_seconds / max(self.bytes, 1)
