"""What the gate's effect runners (unloads, process starts) need of the gate that owns them.

A protocol, so the runners are typed against the owner without importing it: `Gate`
builds them and satisfies this.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

from gpugate.config.model import Config
from gpugate.core.classes import PriorityClass
from gpugate.core.effects import Preempt
from gpugate.core.failures import Failure
from gpugate.core.lifecycle import LifeReport
from gpugate.core.observation import HostObservation
from gpugate.core.placement import PlacementRule, Placing
from gpugate.core.residents import ResidentKey
from gpugate.core.state import GateCore
from gpugate.core.tickets import Demand, Lease
from gpugate.gate.links import Link
from gpugate.gpu.sampler import Sampler
from gpugate.runtimes.base import ApiFamily
from gpugate.runtimes.replies import ErrorReply


class StartBook(Protocol):
    """The start leases the gate holds for processes it starts."""

    def held(self, consumer: str) -> Lease | None: ...

    def own(self, lease: Lease) -> None: ...


class ProcessFront(Protocol):
    """The process runtimes the gate starts, as a request sees them."""

    def fronts(self, link: Link) -> bool: ...

    def absent(self, link: Link) -> bool: ...

    async def settle(self, link: Link) -> bool: ...

    def stand_in(self, link: Link, method: str, path: str, api: ApiFamily) -> ErrorReply | None: ...

    async def running(self, link: Link) -> bool: ...

    async def serve_lease(self, link: Link, priority: PriorityClass) -> Lease: ...

    def switch_broke(self, link: Link) -> None: ...


class ExchangeOwner(Protocol):
    """The gate, as a request's exchange sees it: the books it moves and its processes."""

    processes: ProcessFront

    def loaded(self, lease: Lease) -> None: ...

    def job_started(
        self, lease: Lease, job: str | None, *, kind: ResidentKey | None = None, scale: float = 0.0
    ) -> None: ...

    def released_by_caller(self, lease: Lease) -> bool: ...

    def release(self, lease: Lease, *, failed: bool = False) -> None: ...

    def release_all(self, leases: Sequence[Lease], *, failed: bool = False) -> None: ...

    def report(self, failure: Failure) -> None: ...

    def want_reconcile(self, consumer: str) -> None: ...

    async def acquire_on(
        self,
        demand: Demand,
        gpus: Sequence[int],
        *,
        placing: Placing = Placing.GATE,
        rule: PlacementRule | None = None,
    ) -> tuple[Lease, ...]: ...

    def withdraw(self, link: Link, job: str | None, demand: Demand) -> None: ...


class GateOwner(Protocol):
    """The owner of live state, as the effect runners see it."""

    config: Config
    core: GateCore
    links: dict[str, Link]
    sampler: Sampler
    clock: Callable[[], float]
    starts: StartBook

    async def acquire(self, demand: Demand) -> Lease: ...

    def release(self, lease: Lease, *, failed: bool = False) -> None: ...

    def process_ready(self, lease: Lease) -> None: ...

    def start_process(self, lease: Lease) -> None: ...

    def life_report(self, consumer: str, report: LifeReport, detail: str = "") -> None: ...

    def measured_envelope(self, key: ResidentKey) -> int | None: ...

    def learn_envelope(self, key: ResidentKey, nbytes: int) -> None: ...

    def report(self, failure: Failure) -> None: ...

    def observe(self, sample: HostObservation) -> None: ...

    def unloaded(
        self, key: ResidentKey, *, reclaimed: bool, failure: Failure | None = None
    ) -> None: ...

    def preempted(self, effect: Preempt, failure: Failure | None) -> None: ...

    def withdrawn(self, demand: Demand) -> None: ...

    def loop_failed(self, loop: str, failure: Failure) -> None: ...

    def want_reconcile(self, consumer: str) -> None: ...
