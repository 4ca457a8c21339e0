"""Failure classes: every way a request can fail at the gate, each a structured event."""

from __future__ import annotations

import enum

import attrs


class FailureClass(enum.Enum):
    MODEL_LOAD_FAILED = "MODEL_LOAD_FAILED"
    GPU_OOM = "GPU_OOM"
    RUNTIME_CRASH = "RUNTIME_CRASH"
    TIMEOUT = "TIMEOUT"
    HEALTHCHECK_FAILED = "HEALTHCHECK_FAILED"
    INVALID_OUTPUT = "INVALID_OUTPUT"
    ARTIFACT_CORRUPT = "ARTIFACT_CORRUPT"
    CAPABILITY_UNAVAILABLE = "CAPABILITY_UNAVAILABLE"
    DRIVER_ERROR = "DRIVER_ERROR"
    SCHEDULER_STATE_STALE = "SCHEDULER_STATE_STALE"
    INSUFFICIENT_SCHEDULABLE_VRAM = "INSUFFICIENT_SCHEDULABLE_VRAM"
    EXTERNAL_GPU_PRESSURE = "EXTERNAL_GPU_PRESSURE"
    RESIDENCY_CONFLICT = "RESIDENCY_CONFLICT"
    EVICTION_NOT_ALLOWED = "EVICTION_NOT_ALLOWED"
    DEADLINE_CANNOT_BE_MET = "DEADLINE_CANNOT_BE_MET"
    LEASE_CONFLICT = "LEASE_CONFLICT"
    GPU_MEMORY_NOT_RECLAIMED = "GPU_MEMORY_NOT_RECLAIMED"
    QUEUE_FULL = "QUEUE_FULL"
    LEASE_TIMEOUT = "LEASE_TIMEOUT"
    UNLEASED_GPU_USE = "UNLEASED_GPU_USE"
    """The consumers hold more than the gate leased them (a model loaded behind its back, a
    load larger than its envelope): pressure the gate's own books caused, not others."""
    START_BACKOFF = "START_BACKOFF"
    """A process runtime's last starts failed: the gate waits before starting it again."""

    @property
    def http_status(self) -> int:
        """The status a client sees: capacity 503 (incl. a lease wait that ran out), upstream 502,
        upstream timeouts 504."""
        return _STATUS.get(self, 503)

    @property
    def is_capacity(self) -> bool:
        """Capacity failures may be retried later and carry Retry-After."""
        return self.http_status == 503


_STATUS = {
    FailureClass.MODEL_LOAD_FAILED: 502,
    FailureClass.GPU_OOM: 502,
    FailureClass.RUNTIME_CRASH: 502,
    FailureClass.HEALTHCHECK_FAILED: 502,
    FailureClass.INVALID_OUTPUT: 502,
    FailureClass.ARTIFACT_CORRUPT: 502,
    FailureClass.TIMEOUT: 504,
    FailureClass.DEADLINE_CANNOT_BE_MET: 503,
    FailureClass.CAPABILITY_UNAVAILABLE: 501,
    FailureClass.DRIVER_ERROR: 503,
    FailureClass.SCHEDULER_STATE_STALE: 503,
    FailureClass.INSUFFICIENT_SCHEDULABLE_VRAM: 503,
    FailureClass.EXTERNAL_GPU_PRESSURE: 503,
    FailureClass.RESIDENCY_CONFLICT: 503,
    FailureClass.EVICTION_NOT_ALLOWED: 503,
    FailureClass.LEASE_CONFLICT: 409,
    FailureClass.GPU_MEMORY_NOT_RECLAIMED: 503,
    FailureClass.QUEUE_FULL: 503,
    FailureClass.LEASE_TIMEOUT: 503,
    FailureClass.START_BACKOFF: 503,
    FailureClass.UNLEASED_GPU_USE: 503,
}


@attrs.frozen
class Failure:
    """One failure, as logged (one JSON line) and as told to the client."""

    failure_class: FailureClass
    message: str
    consumer: str | None = None
    model: str | None = None
    gpu: int | None = None
    bytes_needed: int | None = None
    bytes_schedulable: int | None = None
    retry_after: float | None = None
    detail: str | None = None

    def as_event(self) -> dict[str, object]:
        """The structured event, ready for a JSON log line."""
        event: dict[str, object] = {"event": "failure", "class": self.failure_class.value}
        for key in ("consumer", "model", "gpu", "bytes_needed", "bytes_schedulable", "detail"):
            value = getattr(self, key)
            if value is not None:
                event[key] = value
        event["message"] = self.message
        return event
