"""Suspects: evicted models whose memory NVML never showed back.

An unload the runtime answered but NVML did not confirm leaves the model on the books as
`suspect`: its bytes stay counted, it is no victim and has no idle timer, so the gate does
not ask the runtime again in a loop. It leaves the books once a sample shows its consumer
holding no more than its other residents and loads explain.
"""

from __future__ import annotations

from gpugate.core.books import Books
from gpugate.core.effects import Effect, EventKind
from gpugate.core.listing import resident_event
from gpugate.core.observation import GpuObservation
from gpugate.core.residents import ResidentState


def clear_suspects(books: Books, observation: GpuObservation, now: float) -> list[Effect]:
    """Drop the suspects of this GPU whose consumer's memory came back after all."""
    gpu = observation.index
    residents = books.on_gpu(gpu)
    suspects = [r for r in residents if r.state is ResidentState.SUSPECT]
    effects: list[Effect] = []
    for suspect in suspects:
        consumer = suspect.key.consumer
        others = sum(
            r.bytes for r in residents if r.key.consumer == consumer and r.key != suspect.key
        )
        others += sum(
            lease.pending for lease in books.leases_on(gpu) if lease.key.consumer == consumer
        )
        if observation.managed.get(consumer, 0) <= others:
            del books.residents[suspect.key]
            books.touch()
            effects.append(
                resident_event(
                    EventKind.RESIDENT_GONE, now, suspect, "its memory came back after all"
                )
            )
    return effects
