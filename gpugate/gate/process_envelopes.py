"""What a process the gate started holds, learned as its model's measured envelope.

A process runtime's memory is its process's. Once the gate started it and it answered, the
most NVML showed of it during that run is what its model takes: the next start of that
model is leased that much (as a listed model is measured from its listing). Only the
model it started with is learned: after a `/load` the process also held, for a while, what
it freed. What is learned is what the sample showed of the process, never the resident's
bytes: while it serves a request those stay its lease's envelope (residents follow NVML
only when idle), and a peak taken from them is the envelope learned back.
"""

from __future__ import annotations

from gpugate.core.residents import Resident, ResidentKey, ResidentState
from gpugate.core.scopes import accounted
from gpugate.core.state import GateCore
from gpugate.gate.envelopes import EnvelopeBook
from gpugate.gate.link import Link
from gpugate.gate.process_books import process_model


class ProcessEnvelopes:
    """Peaks of the processes the gate started, by the model each started with."""

    def __init__(self, core: GateCore, links: dict[str, Link], envelopes: EnvelopeBook) -> None:
        self.core = core
        self.links = links
        self.envelopes = envelopes
        self._peaks: dict[ResidentKey, int] = {}
        """The most each process model held in its current run."""
        self._learning: dict[str, ResidentKey] = {}
        """The model each process runs since its start, by consumer."""

    def starting(self, consumer: str) -> None:
        """A new run begins: its peak is measured afresh."""
        self._learning.pop(consumer, None)
        for key in [k for k in self._peaks if k.consumer == consumer]:
            del self._peaks[key]

    def started(self, key: ResidentKey) -> None:
        """The process answered, running `key.model`: learn what it holds from now."""
        self._learning[key.consumer] = key

    def ended(self, consumer: str) -> None:
        """The process ended: nothing more to learn of this run."""
        self._learning.pop(consumer, None)

    def observe(self) -> None:
        """After a sample: a running process's new peak is its model's measured envelope."""
        for name, key in list(self._learning.items()):
            link = self.links.get(name)
            if link is None or process_model(link.runtime.lifecycle) != key.model:
                # It switched models (/load): its memory is no longer one model's.
                del self._learning[name]
                continue
            resident = self.core.resident(key)
            if (
                resident is None
                or not (resident.process and resident.shown)
                or resident.state is not ResidentState.RESIDENT
            ):
                continue
            shown = self._shown(resident)
            if shown <= self._peaks.get(key, 0):
                continue
            self._peaks[key] = shown
            self.envelopes.learn_peak(key, shown)

    def _shown(self, resident: Resident) -> int:
        """What the last sample showed of the resident's process: its consumer's memory on
        its GPU beyond what the books hold for the consumer's other residents and leases."""
        observation = self.core.telemetry.observations.get(resident.gpu)
        if observation is None:
            return 0
        consumer = resident.key.consumer
        books = self.core.books
        held = observation.managed.get(consumer, 0)
        return held - accounted(books, consumer, resident.gpu, but=resident.key)
