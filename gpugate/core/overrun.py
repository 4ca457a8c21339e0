"""Overrun: a consumer that holds more than the gate leased it, noticed within one sample.

A runtime that sizes itself grows past its lease: a load larger than its envelope, a KV
cache or a working set that grows, a runtime taking free memory for itself.
The budget already counts what a sample shows beyond the books (`committed` takes the
consumer's unexplained memory from that sample on), so nothing is granted into it after
the sample. What this adds:

* **Noticed.** On the sample it shows, an `overrun` event names the consumer, the bytes
  beyond its books and, where only one of its residents or leases can have grown, which
  one (`Overrun.key`): NVML does not say which of a consumer's models took the memory,
  and until its runtime lists what it holds a model loaded behind the gate's back looks
  the same.
* **Grants made on the old numbers protected.** While an overrun grew at the last sample,
  nothing new is granted on its GPU (the tickets wait, a demand asked for at once is
  deferred): the memory may still be going while the next sample is taken. Leases granted
  before, whose loads now find less room, are what pressure relief gives idle memory back
  for (`gpugate.core.relief`).
* **Learned.** The `Overrun` effect carries what the one resident now holds, which the gate
  keeps as its measured size (`gate/envelopes.py`). A runtime that can be asked to shrink
  would be asked there.

What a consumer held before the gate leased it anything (a CUDA context, a process
adopted with its memory) is its own, not an overrun: it is the floor the excess is
measured from, the least seen since its books last held nothing (while nothing of it was
loading). A job its runtime runs before its lease (`gpugate.core.early`) takes memory on
purpose and is not judged here, nor is a process whose resident follows NVML (its memory
is its process's, and what it grows to is its measured size).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

import attrs

from gpugate.core.books import Books
from gpugate.core.effects import Effect, Event, EventKind, Overrun
from gpugate.core.job_leases import JOBS_MODEL
from gpugate.core.observation import GpuObservation
from gpugate.core.residents import ResidentKey, ResidentState
from gpugate.core.scopes import HELD_MODEL
from gpugate.core.units import MiB, format_gib

TOLERANCE = 64 * MiB
"""Growth smaller than this is allocator noise, not an overrun (the runtimes' allocators
and compute buffers grow in blocks of a few to tens of MiB)."""


@attrs.define
class _Watch:
    floor: int = 0
    """What the consumer held beyond its books when they held nothing for it."""
    reported: int = 0
    """The overrun last reported in this episode (0: none)."""


@attrs.define
class OverrunWatch:
    """Per GPU and consumer, what of its memory beyond the books was already there, and
    what was reported; which GPUs have an overrun that grew at their last sample."""

    tolerance: int = TOLERANCE
    _watches: dict[tuple[int, str], _Watch] = attrs.field(factory=dict)
    _growing: set[int] = attrs.field(factory=set)

    def growing(self, gpu: int) -> bool:
        """Whether an overrun on `gpu` grew at its last sample (new grants there wait)."""
        return gpu in self._growing

    def observe(
        self,
        observation: GpuObservation,
        books: Books,
        unexplained: dict[str, int],
        now: float,
        *,
        early: Collection[str] = (),
        may_grow: Mapping[str, int] | None = None,
    ) -> list[Effect]:
        """Judge one GPU's sample: `unexplained` is what it shows of each consumer beyond
        the books; `early`, the consumers with a job running before its lease; `may_grow`,
        what each consumer's loads granted at their floor may take up to their ceiling
        (`gpugate.core.floors`): growth within it is no overrun."""
        may_grow = may_grow or {}
        gpu = observation.index
        usage = books.usage(gpu)
        self._growing.discard(gpu)
        effects: list[Effect] = []
        for consumer in sorted(set(observation.managed) | set(usage.resident) | set(usage.pending)):
            excess = unexplained.get(consumer, 0)
            pending = usage.pending.get(consumer, 0)
            leased = usage.resident.get(consumer, 0) + pending
            watch = self._watches.setdefault((gpu, consumer), _Watch())
            if not leased or consumer in early or _follows_nvml(books, consumer, gpu, pending):
                watch.floor, watch.reported = excess, 0
                continue
            if not pending:
                # A lease not yet shown hides what the consumer held before it (the
                # excess is clamped at 0 while NVML shows less than the books): the
                # floor moves only while nothing of the consumer's is loading.
                watch.floor = min(watch.floor, excess)
            over = excess - watch.floor - may_grow.get(consumer, 0)
            if over <= self.tolerance:
                watch.reported = 0
                continue
            if over <= watch.reported + self.tolerance:
                continue
            watch.reported = over
            self._growing.add(gpu)
            effects.extend(self._noticed(observation, books, consumer, leased, watch, over, now))
        return effects

    def _noticed(
        self,
        observation: GpuObservation,
        books: Books,
        consumer: str,
        leased: int,
        watch: _Watch,
        over: int,
        now: float,
    ) -> list[Effect]:
        gpu = observation.index
        held = _holders(books, consumer, gpu)
        key = next(iter(held)) if len(held) == 1 else None
        # A job's lease or an explicit one names no model whose size could be learned.
        learnable = (
            key is not None
            and key.model not in (JOBS_MODEL, HELD_MODEL)
            and any(r.key == key for r in books.on_gpu(gpu))
        )
        measured = held[key] + over if key is not None else None
        shown = observation.managed.get(consumer, 0)
        own = f", {format_gib(watch.floor)} of it its own before any lease" if watch.floor else ""
        if key is not None:
            what = f"{key} holds about {format_gib(measured or 0)} where it was leased "
            what += f"{format_gib(held[key])}"
        else:
            names = ", ".join(str(k) for k in sorted(held, key=str)) or "nothing it holds"
            what = f"one of {names} grew past its lease, or a model was loaded behind the gate"
        detail = (
            f"NVML shows {format_gib(shown)} for {consumer} on GPU {gpu}, "
            f"{format_gib(over)} more than the gate leased it ({format_gib(leased)}{own}): "
            f"{what}; counted from this sample, new grants on GPU {gpu} wait until it "
            "stops growing"
        )
        return [
            Event(EventKind.OVERRUN, now, key=key, consumer=consumer, gpu=gpu, bytes=over,
                  detail=detail),
            Overrun(consumer, gpu, over, key, measured if learnable else None),
        ]  # fmt: skip


def _follows_nvml(books: Books, consumer: str, gpu: int, pending: int) -> bool:
    """Whether the consumer's books on the GPU are what NVML shows of it: only residents
    that grow and shrink with its process (`gpugate.core.scopes.follow_observed`), nothing
    loading. What such a process grows to is its size (learned as its peak), not an
    overrun of the books."""
    residents = [r for r in books.on_gpu(gpu) if r.key.consumer == consumer]
    return (
        not pending and bool(residents) and all(r.tracks_observed and r.process for r in residents)
    )


def _holders(books: Books, consumer: str, gpu: int) -> dict[ResidentKey, int]:
    """What the books hold for the consumer on the GPU, by key: residents (a loading one
    carries its lease's bytes) and leases that load no resident (a job's, an explicit one)."""
    held = {
        r.key: r.bytes
        for r in books.on_gpu(gpu)
        if r.key.consumer == consumer and r.state is not ResidentState.UNLOADING and r.bytes
    }
    for lease in books.leases_on(gpu):
        if lease.key.consumer == consumer and lease.pending and lease.key not in held:
            held[lease.key] = lease.pending
    return held
