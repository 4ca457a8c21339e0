"""The envelope book: what the gate knows of the memory a model, a job's kind or a process
takes before it loads. It is the only owner of those figures:

* **configured**: consumers.yaml's (the runtime's `ModelSettings`);
* **measured**: what a runtime's listing said a loaded model takes, what NVML showed a
  resident holding past its lease (an overrun, which a smaller listing does not undo), the
  peak NVML showed of a process the gate started, or of a job that ran alone and well
  (with the scale it ran at); kept in the store across restarts;
* **estimated**: what the runtime's `Memory` part says a load of the model takes before
  it was ever measured, from the model itself (its file), kept for ESTIMATE_TTL.

A demand leases the first of these it has. Every figure about a runtime comes through its
`Memory` part: the book takes that part, never the whole runtime.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable

import aiohttp
import attrs

from gpugate.config.model import Consumer
from gpugate.core.residents import ResidentKey
from gpugate.core.state import GateCore
from gpugate.core.tickets import Sizing
from gpugate.gate.failure import GateFailure
from gpugate.gate.upstream import upstream_failure
from gpugate.runtimes.base import Measured, Memory
from gpugate.runtimes.footprint import Cards, Elasticity, Footprint
from gpugate.store.db import MeasuredEnvelope, Store

ESTIMATE_TTL = 60.0
"""Seconds a runtime's estimate of a model stands before it is asked again."""


def sizing_of(memory: Memory) -> Sizing:
    """How the core is to take a runtime's loads: fitted to the memory it sees free, or fixed
    (a share of the card is fixed too: it is taken whatever is free)."""
    return Sizing.FITS_FREE if memory.elasticity is Elasticity.FITTED else Sizing.FIXED


def cards_of(core: GateCore, consumer: Consumer) -> Cards:
    """The consumer's cards as its runtime sees them: their totals, once sampled."""
    totals = []
    for gpu in consumer.cards:
        observation = core.observation(gpu)
        if observation is None:
            return Cards()
        totals.append(observation.total)
    return Cards(tuple(totals))


class EnvelopeBook:
    """Configured, measured and estimated sizes, by consumer, model and options."""

    def __init__(self, store: Store | None, clock: Callable[[], float]) -> None:
        self.store = store
        self.clock = clock
        self._measured: dict[ResidentKey, int] = {}
        self._overran: dict[ResidentKey, int] = {}
        """What NVML showed residents holding past their leases, by key."""
        self._scales: dict[ResidentKey, float] = {}
        """The scale each measured job kind ran at (ComfyUI: megapixels)."""
        self._estimates: dict[tuple[str, str, str], tuple[float, Footprint | None]] = {}
        """By (consumer, model, options): when the runtime was asked, and its answer."""

    def load(self, envelopes: Iterable[MeasuredEnvelope]) -> None:
        """What the store kept of earlier runs."""
        for envelope in envelopes:
            key = ResidentKey(envelope.consumer, envelope.model, envelope.options)
            self._measured[key] = envelope.bytes
            if envelope.scale is not None:
                self._scales[key] = envelope.scale

    # -- what the gate has without asking ------------------------------------------------

    def measured(self, key: ResidentKey) -> int | None:
        """What the gate measured of a model (or a process's memory) once it was loaded."""
        return self._measured.get(key)

    def seen(self, consumer: str, model: str) -> bool:
        """Whether a load of this consumer's model was ever measured (any options)."""
        return any(key[:2] == (consumer, model) for key in self._measured)

    def measured_job(self, kind: ResidentKey) -> Measured | None:
        """The peak measured for jobs of this kind, if any."""
        nbytes = self._measured.get(kind)
        return None if nbytes is None else Measured(nbytes, self._scales.get(kind))

    def known(self, consumer: str, memory: Memory, model: str, options: str) -> int | None:
        """Configured or measured bytes for a model, when the gate has them without asking."""
        configured = memory.configured(model)
        if configured is not None:
            return configured
        return self._measured.get(ResidentKey(consumer, model, options))

    def known_from(
        self, consumer: str, memory: Memory, model: str, options: str
    ) -> tuple[int, str] | None:
        """The bytes a request for the model would lease, as far as the gate knows them
        without asking the runtime, and where they come from: `configured`, `measured`, or
        an `estimate` made in the last minute. None: only the runtime could say."""
        configured = memory.configured(model)
        if configured is not None:
            return configured, "configured"
        measured = self._measured.get(ResidentKey(consumer, model, options))
        if measured is not None:
            return measured, "measured"
        cached = self._estimates.get((consumer, model, options))
        fresh = cached is not None and self.clock() - cached[0] < ESTIMATE_TTL
        if fresh and cached is not None and cached[1] is not None:
            return cached[1].ceiling, "estimate"
        return None

    # -- what the runtime says -----------------------------------------------------------

    async def envelope(
        self,
        consumer: Consumer,
        memory: Memory,
        session: aiohttp.ClientSession,
        model: str,
        options: str,
        cards: Cards,
    ) -> Footprint | None:
        """What a load of the model takes: configured, else measured, else estimated by the
        runtime's `Memory` from the model itself (with its floor, where it degrades).

        None when the runtime does not know the model (it answers 404 without loading).
        """
        known = self.known(consumer.name, memory, model, options)
        if known is not None:
            return Footprint.fixed(known)
        cache_key = (consumer.name, model, options)
        cached = self._estimates.get(cache_key)
        now = self.clock()
        if cached is not None and now - cached[0] < ESTIMATE_TTL:
            return cached[1]
        try:
            async with asyncio.timeout(consumer.timeouts.control):
                estimate = await memory.estimate(session, model, options, cards)
        except Exception as exc:
            failure = upstream_failure(consumer, exc, f"cannot size {model}", model=model)
            raise GateFailure(failure) from exc
        if estimate is not None:
            # Not an unknown model: one pulled a moment later must be sized, not passed.
            self._estimates[cache_key] = (now, estimate)
        return estimate

    # -- what the gate measured ----------------------------------------------------------

    def learn_listed(self, key: ResidentKey, nbytes: int) -> None:
        """What the runtime's listing says a loaded model holds (0 for one on the CPU),
        unless NVML showed it holding more (`learn_overrun`): NVML over a runtime's own
        figure."""
        if nbytes < self._overran.get(key, 0):
            return
        if self._measured.get(key) != nbytes:
            self._measured[key] = nbytes
            self._record(MeasuredEnvelope(key.consumer, key.model, key.options, nbytes))

    def learn_peak(self, key: ResidentKey, nbytes: int) -> None:
        """What a running process held at most: its model's measured envelope."""
        if nbytes > 0 and self._measured.get(key) != nbytes:
            self._measured[key] = nbytes
            self._record(MeasuredEnvelope(key.consumer, key.model, key.options, nbytes))

    def learn_overrun(self, key: ResidentKey, nbytes: int) -> None:
        """What NVML showed a resident holding past its lease (`gpugate.core.overrun`): its
        measured size from now on, keyed by its consumer, model and runner options."""
        if nbytes > self._measured.get(key, 0):
            self._measured[key] = self._overran[key] = nbytes
            self._record(MeasuredEnvelope(key.consumer, key.model, key.options, nbytes))

    def learn_job(self, kind: ResidentKey, peak: int, scale: float) -> None:
        """The peak of a job that ran alone and well, at its scale: its kind's envelope."""
        self._measured[kind] = peak
        self._scales[kind] = scale
        envelope = MeasuredEnvelope(kind.consumer, kind.model, kind.options, peak)
        self._record(attrs.evolve(envelope, scale=scale))

    def _record(self, envelope: MeasuredEnvelope) -> None:
        if self.store is not None:
            self.store.record_envelope(envelope)
