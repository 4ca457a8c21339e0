"""What the core decides: effects for the gate to carry out, and events to record."""

from __future__ import annotations

import enum

import attrs

from gpugate.core.failures import Failure
from gpugate.core.residents import ResidentKey
from gpugate.core.tickets import Lease


@attrs.frozen
class Grant:
    """A waiting ticket got its lease: wake its request."""

    ticket_id: int
    lease: Lease


@attrs.frozen
class Reject:
    """A waiting ticket failed: answer its request with the failure."""

    ticket_id: int
    failure: Failure


class UnloadReason(enum.Enum):
    EVICTION = "eviction"
    """Idle lower-class memory taken for a higher-class demand."""
    REPLACE = "replace"
    """The same model with other runner options is about to be loaded."""
    TTL = "ttl"
    """Idle longer than its residency policy allows."""
    PRESSURE = "pressure"
    """External use grew into the reserve; idle memory is given back."""
    OPERATOR = "operator"
    """An operator asked for it over the control API."""
    WITHDRAWN = "withdrawn"
    """What a job its runtime ran before its lease left behind, the lease not to be had
    (`gpugate.core.early`): nobody asked for that memory."""


@attrs.frozen
class Unload:
    """Unload a resident and confirm with NVML that its bytes came back."""

    key: ResidentKey
    gpu: int
    bytes: int
    reason: UnloadReason
    for_ticket: int | None = None


@attrs.frozen
class Stop(Unload):
    """Stop the runtime's process: its memory goes with it (confirmed as an unload is)."""


@attrs.frozen
class Sleep(Unload):
    """Put the runtime to sleep: its model's memory is given back, its context stays."""


@attrs.frozen
class Start:
    """Start the runtime's process under its PROCESS lease, and report how it went."""

    consumer: str
    gpu: int
    lease: int


@attrs.frozen
class Wake:
    """Wake the sleeping runtime under its PROCESS lease, and report how it went."""

    consumer: str
    gpu: int
    lease: int


@attrs.frozen
class Preempt:
    """Stop a consumer's jobs on a GPU (the running one interrupted, the pending ones
    deleted) so that a higher-class demand its `preempt` lists can have their memory."""

    consumer: str
    gpu: int
    jobs: tuple[str, ...]
    """The runtime's names of the jobs, newest first (pending ones go before the running
    one can hand the worker to them)."""
    bytes: int
    """What the job lease held."""
    for_ticket: int


@attrs.frozen
class Overrun:
    """A consumer holds more on a GPU than the gate leased it (`gpugate.core.overrun`).
    The gate keeps what the one resident it could be pinned on now holds as its measured
    size; a runtime that can be asked to give memory back would be asked here."""

    consumer: str
    gpu: int
    bytes: int
    """What NVML shows beyond the books (and beyond what the consumer held before any lease)."""
    key: ResidentKey | None = None
    """The one resident or lease that can have grown (None: NVML cannot tell which)."""
    measured: int | None = None
    """What that one holds now, by NVML."""


class EventKind(enum.Enum):
    LEASE_GRANTED = "lease_granted"
    LEASE_RELEASED = "lease_released"
    TICKET_QUEUED = "ticket_queued"
    TICKET_CANCELLED = "ticket_cancelled"
    FAILURE = "failure"
    EVICTION_STARTED = "eviction_started"
    EVICTION_DONE = "eviction_done"
    OUT_OF_BAND_RESIDENT = "out_of_band_resident"
    RESIDENT_GONE = "resident_gone"
    PARTIAL_OFFLOAD = "partial_offload"
    CPU_ONLY = "cpu_only"
    """Loaded with none of its bytes on the GPU: not a partial offload, a CPU load."""
    PRESSURE_ENTERED = "pressure_entered"
    PRESSURE_CLEARED = "pressure_cleared"
    ENVELOPE_MEASURED = "envelope_measured"
    PREEMPTION_STARTED = "preemption_started"
    """A consumer's jobs are being stopped for a higher-class demand it lets preempt them."""
    CONSUMER_DRAINING = "consumer_draining"
    """An operator drains a consumer: it admits nothing new, in-flight work finishes."""
    CONSUMER_DRAINED = "consumer_drained"
    """A draining consumer holds no lease any more."""
    CONSUMER_UNDRAINED = "consumer_undrained"
    GPU_PAUSED = "gpu_paused"
    """An operator paused admission on a GPU: new demands wait in its queue."""
    GPU_RESUMED = "gpu_resumed"
    LIFECYCLE = "lifecycle"
    """A runtime's lifecycle moved (stopped, starting, up, asleep, stopping): `detail`."""
    OVERRUN = "overrun"
    """A consumer holds more than the gate leased it (`gpugate.core.overrun`)."""
    REWARM_STARTED = "rewarm_started"
    """A kept-warm model evicted for a higher class is loaded again (`gpugate.core.rewarm`)."""
    REWARM_DONE = "rewarm_done"
    REWARM_CANCELLED = "rewarm_cancelled"
    """A rewarm gave way to a real demand before it was granted."""
    REWARM_FAILED = "rewarm_failed"
    DEGRADED = "degraded"
    """A lease granted at its floor, its ceiling not to be had in time (`gpugate.core.floors`):
    `bytes` granted, `ceiling` asked for, `reason` what the ceiling met."""
    SWAP = "swap"
    """A model evicted for a demand is loaded again on its GPU within `swap_window`
    (`gpugate.core.swaps`): `wait` is the seconds between."""


@attrs.frozen
class Event:
    """A structured event for the log, the store and the metrics."""

    kind: EventKind
    time: float
    key: ResidentKey | None = None
    consumer: str | None = attrs.field(
        default=attrs.Factory(lambda self: self.key.consumer if self.key else None, takes_self=True)
    )
    """The key's consumer unless given (events without a key, such as failures, give it)."""
    model: str | None = attrs.field(
        default=attrs.Factory(lambda self: self.key.model if self.key else None, takes_self=True)
    )
    gpu: int | None = None
    bytes: int | None = None
    detail: str = ""
    failure: Failure | None = None
    wait: float | None = None
    reason: str | None = None
    priority: str | None = None
    """The class of the request (lease events) as a label."""
    schedulable_before: int | None = None
    """EVICTION_STARTED: the GPU's schedulable bytes when the unload was decided."""
    schedulable_after: int | None = None
    """EVICTION_DONE: the GPU's schedulable bytes once the unload finished."""
    lease: int | None = None
    """LEASE_GRANTED and LEASE_RELEASED: the lease's id, as `X-GPUGate-Lease` names it."""
    ceiling: int | None = None
    """DEGRADED: the bytes the demand asked for (`bytes` is the floor it was granted)."""


Effect = Grant | Reject | Unload | Preempt | Start | Wake | Overrun | Event
