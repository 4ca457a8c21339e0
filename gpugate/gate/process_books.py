"""What the books say of a process runtime: its resident, whether it is going or starting
elsewhere, the demand for its start or for a request on it, and its failures. Read-only:
`ProcessStarts` (starts.py) acts on it."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Protocol

import attrs

from gpugate.core.classes import PriorityClass
from gpugate.core.failures import Failure, FailureClass
from gpugate.core.lifecycle import LifeReport
from gpugate.core.residents import Resident, ResidentKey, ResidentState
from gpugate.core.state import GateCore
from gpugate.core.tickets import Demand, Lease, LeaseScope
from gpugate.gate.envelopes import EnvelopeBook, cards_of, sizing_of
from gpugate.gate.link import Link
from gpugate.gate.start_leases import StartLeases
from gpugate.runtimes.base import Lifecycle
from gpugate.runtimes.footprint import Footprint
from gpugate.runtimes.process import ProcessControl

DEFAULT_START_ADMISSION_TIMEOUT = 120.0
"""For a consumer without `control:` (its config default is the same)."""


class LifeReports(Protocol):
    """What the gate's process parts report to it: what a runtime's lifecycle did or is to
    do (the core decides what follows), and failures."""

    def life_report(self, consumer: str, report: LifeReport, detail: str = "") -> None: ...

    def start_process(self, lease: Lease) -> None: ...

    def process_ready(self, lease: Lease) -> None: ...

    def report(self, failure: Failure) -> None: ...


def control_of(link: Link) -> ProcessControl | None:
    """The control the gate starts and stops the link's process with; None when it has none
    (not a process runtime, or one the gate only talks to)."""
    lifecycle = link.runtime.lifecycle
    return None if lifecycle is None else lifecycle.control


def process_model(lifecycle: Lifecycle | None) -> str | None:
    """The model a process runtime's process holds; None for any other runtime."""
    return None if lifecycle is None else lifecycle.process_model()


class ProcessBooks:
    """A process runtime as the gate's books hold it."""

    def __init__(
        self,
        core: GateCore,
        envelopes: EnvelopeBook,
        starts: StartLeases,
        clock: Callable[[], float],
    ) -> None:
        self.core = core
        self.envelopes = envelopes
        self.starts = starts
        self.clock = clock

    def envelope(self, link: Link) -> int | None:
        """The bytes of the process's current model, as `size` finds them."""
        model = process_model(link.runtime.lifecycle)
        found = None if model is None else self.size(link, model)
        return None if found is None else found.ceiling

    def size(self, link: Link, model: str) -> Footprint | None:
        """What the runtime's memory says a process of `model` takes: configured, else
        read from the model's file on this host."""
        memory = link.runtime.memory
        configured = memory.configured(model)
        if configured is not None:
            return Footprint.fixed(configured)
        return memory.read(model, cards_of(self.core, link.consumer))

    def live(self, link: Link) -> Resident | None:
        """The consumer's process in the books (loading or resident), its current model first."""
        current = process_model(link.runtime.lifecycle)
        found = None
        for resident in self.residents(link):
            if resident.key.consumer != link.consumer.name or resident.state not in (
                ResidentState.RESIDENT,
                ResidentState.LOADING,
            ):
                continue
            if resident.key.model == current:
                return resident
            found = found or resident
        return found

    def going(self, link: Link) -> bool:
        return any(
            r.key.consumer == link.consumer.name and r.state is ResidentState.UNLOADING
            for r in self.residents(link)
        )

    def switching(self, link: Link) -> bool:
        """Whether a request is switching the process's model now (its lease still open)."""
        name = link.consumer.name
        return any(
            lease.key.consumer == name and lease.demand.switch and lease.pending
            for lease in self.core.leases()
        )

    def admitted_elsewhere(self, link: Link) -> bool:
        """`gpugate admit` holds a start lease: the process is starting outside the gate."""
        held = self.starts.held(link.consumer.name)
        return held is not None and held.demand.explicit

    def residents(self, link: Link) -> list[Resident]:
        """The residents on the consumer's GPUs."""
        cards = link.consumer.cards
        return [r for r in self.core.residents() if r.gpu in cards]

    def shown_on(self, link: Link) -> int:
        """The GPU of the consumer's where NVML shows memory the books do not explain (a
        process found running), else its first."""
        return self.core.telemetry.unexplained_card(link.consumer.name, link.consumer.cards)

    def demand(
        self,
        link: Link,
        priority: PriorityClass,
        key: ResidentKey | None = None,
        gpu: int | None = None,
    ) -> Demand:
        """The process's start (PROCESS scope), or a request on its resident `key` (on
        `gpu`; a start's GPU is placed among the consumer's)."""
        settings = link.runtime.settings
        consumer = link.consumer
        model = process_model(link.runtime.lifecycle) if key is None else key.model
        assert model is not None
        measured = self.envelopes.measured(ResidentKey(consumer.name, model))
        footprint = self.size(link, model)
        if footprint is None and model != process_model(link.runtime.lifecycle):
            current = self.envelope(link)
            footprint = None if current is None else Footprint.fixed(current)
        envelope = measured or (footprint.ceiling if footprint is not None else 0)
        floor = footprint.floor if footprint is not None and footprint.degrades else None
        residency = settings.residency(model)
        start = key is None
        return Demand(
            key=key or ResidentKey(consumer.name, model),
            gpu=consumer.cards[0] if gpu is None else gpu,
            envelope=envelope,
            priority=priority,
            resident_priority=settings.model_priority(model),
            policy=residency.policy,
            idle_ttl=residency.idle_ttl,
            reload_seconds=settings.reload_seconds(model, envelope),
            scope=LeaseScope.PROCESS if start else LeaseScope.REQUEST,
            appear_within=(
                consumer.control.start_admission_timeout
                if start and consumer.control is not None
                else None
            ),
            floor=None if measured else floor,
            sizing=sizing_of(link.runtime.memory),
        )

    def admission_timeout(self, link: Link) -> float:
        control = link.consumer.control
        return control.start_admission_timeout if control else DEFAULT_START_ADMISSION_TIMEOUT

    def backoff(self, link: Link, *, until_up: bool = False) -> Failure | None:
        """START_BACKOFF while the consumer's last starts failed (or it ended on its own)
        and its backoff runs; with `until_up`, also after that, until a start succeeds."""
        life = self.core.lifecycle(link.consumer.name)
        if life is None:
            return None
        wait = life.backoff.remaining(self.clock())
        if wait <= 0 and not (until_up and life.failing):
            return None
        # Rounded up, as Retry-After is: a start 0.4 s away is not "in 0s".
        when = (
            f"the next start is in {math.ceil(wait)}s" if wait > 0 else "the next request starts it"
        )
        what = f"it failed to start or ended {life.backoff.failures} time(s) in a row; {when}"
        failure = self.failure(link, FailureClass.START_BACKOFF, what)
        return attrs.evolve(failure, retry_after=wait if wait > 0 else None)

    def failure(self, link: Link, cls: FailureClass, what: str) -> Failure:
        consumer = link.consumer
        return Failure(
            cls,
            f"{cls.value}: {consumer.name} ({consumer.upstream.url}): {what}",
            consumer=consumer.name,
            model=process_model(link.runtime.lifecycle),
            gpu=consumer.cards[0],
        )
