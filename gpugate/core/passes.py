"""What a pass over a GPU's queue works with: the answer to a demand, what a pass left
for a ticket that sorts last, one GPU's residents as the planner reads them, and the events
of a grant and of a failure."""

from __future__ import annotations

import enum
from collections.abc import Callable

import attrs

from gpugate.core.books import Books
from gpugate.core.effects import Effect, Event, EventKind
from gpugate.core.failures import Failure
from gpugate.core.job_leases import job_bytes
from gpugate.core.residents import Resident, ResidentKey
from gpugate.core.tickets import Lease
from gpugate.core.views import ResidentSource, ResidentView

UNEXPLAINED = ResidentKey("", "<unexplained>")
"""Claim marker for memory a runtime will name at its next listing."""

FailureFactory = Callable[..., Failure]


@attrs.frozen
class Admission:
    """The answer to a demand: a lease now, a ticket to wait on, or a failure."""

    ticket_id: int
    lease: Lease | None = None
    failure: Failure | None = None
    effects: tuple[Effect, ...] = ()
    deferred: bool = False
    """Asked for at once only (`Scheduler.submit`'s `at_once`) and not grantable now:
    nothing was queued, evicted or recorded for it."""

    @property
    def waiting(self) -> bool:
        return self.lease is None and self.failure is None and not self.deferred


class Outcome(enum.Enum):
    GRANTED = "granted"
    FAILED = "failed"
    WAITING = "waiting"
    FULL = "full"
    """It would have to wait, but its consumer's queue is full."""


@attrs.define
class Tail:
    """What a queue pass left: a ticket that sorts last can be planned from it alone."""

    version: tuple[int, int]
    """The books' stamp of its GPU when it was right (Books.stamp)."""
    schedulable: int
    pool: int
    claimed: set[ResidentKey]
    riding: set[ResidentKey]
    view: ResidentView
    credited: dict[str, int] = attrs.field(factory=dict)
    """Per consumer, its early bytes already credited to a job of the pass (`early`)."""


class GpuResidents(ResidentSource):
    """One GPU's residents read from the books' indexes; what is derived from them is kept
    until the books' residents change."""

    def __init__(self, books: Books, gpu: int) -> None:
        self.books = books
        self.gpu = gpu
        self.version = -1
        super().__init__()

    def reset(self) -> None:
        super().reset()
        self._all: list[Resident] | None = None

    def current(self) -> GpuResidents:
        if self.version != self.books.residents_version:
            self.reset()
            self.version = self.books.residents_version
        return self

    def all(self) -> list[Resident]:
        if self._all is None:
            self._all = self.books.on_gpu(self.gpu)
        return self._all

    def same_model(self, key: ResidentKey) -> list[Resident]:
        return self.books.residents.same_model(self.gpu, key.consumer, key.model)

    def unloading(self) -> list[Resident]:
        # Only `start_unload` makes a resident UNLOADING, and it records the unload.
        return super().unloading() if self.books.unloads else []


def granted_event(lease: Lease) -> Event:
    return Event(
        EventKind.LEASE_GRANTED,
        lease.granted,
        key=lease.key,
        gpu=lease.gpu,
        bytes=lease.pending if lease.job_of is None else job_bytes(lease),
        wait=lease.waited,
        priority=lease.demand.priority.label,
        lease=lease.id,
    )


def failure_event(failure: Failure, now: float) -> Event:
    return Event(
        EventKind.FAILURE,
        now,
        consumer=failure.consumer,
        model=failure.model,
        gpu=failure.gpu,
        bytes=failure.bytes_needed,
        failure=failure,
        detail=failure.message,
    )
