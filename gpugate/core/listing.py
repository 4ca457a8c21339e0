"""A runtime's own listing of what it has loaded, folded into the books.

Residents it no longer lists are gone (unless they changed after the listing was asked
for); models it lists that the books do not know were loaded behind the gate's back and
become residents like any other, with the class and policy the configuration gives them;
the sizes it reports replace the envelopes the gate assumed.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs

from gpugate.core.books import Books
from gpugate.core.classes import PriorityClass, ResidencyPolicy
from gpugate.core.effects import Effect, Event, EventKind
from gpugate.core.residents import ANY_OPTIONS, Resident, ResidentKey, ResidentState


@attrs.frozen
class ListedModel:
    """A model a runtime says it has loaded (Ollama's /api/ps), with the config for it."""

    model: str
    bytes: int | None
    """Bytes in VRAM (size_vram); None when the runtime does not say (the books keep theirs,
    and a model they do not know counts `size`)."""
    size: int
    """Total bytes including what was offloaded to the CPU."""
    priority: PriorityClass
    policy: ResidencyPolicy
    idle_ttl: float | None
    reload_seconds: float = 1.0


def resident_event(
    kind: EventKind,
    now: float,
    resident: Resident,
    detail: str,
    *,
    nbytes: int | None = None,
    reason: str | None = None,
) -> Event:
    """An event about one resident."""
    return Event(
        kind,
        now,
        key=resident.key,
        gpu=resident.gpu,
        bytes=resident.bytes if nbytes is None else nbytes,
        detail=detail,
        reason=reason,
    )


def apply_listing(
    books: Books,
    consumer: str,
    gpu: int,
    listed: Sequence[ListedModel],
    *,
    asked_at: float,
    now: float,
) -> list[Effect]:
    """Change the books to agree with the listing; returns what to record."""
    for done in [k for k, at in books.unloaded_at.items() if k[0] == consumer and at < asked_at]:
        # A listing asked after an unload ended says the truth about that model again.
        del books.unloaded_at[done]
    residents = [r for r in books.residents.values() if r.gpu == gpu]
    effects: list[Effect] = []
    names = {m.model for m in listed}
    for resident in residents:
        if (
            resident.key.consumer == consumer
            and resident.state is ResidentState.RESIDENT
            and resident.key.model not in names
            and resident.in_flight == 0
            and resident.changed_at <= asked_at
        ):
            del books.residents[resident.key]
            effects.append(
                resident_event(
                    EventKind.RESIDENT_GONE, now, resident, "no longer listed by the runtime"
                )
            )
    for model in listed:
        same = [r for r in residents if r.key.consumer == consumer and r.key.model == model.model]
        gone_at = books.unloaded_at.get((consumer, model.model))
        if not same and gone_at is not None and gone_at >= asked_at:
            # Asked before its unload ended: the runtime still named what it was removing.
            continue
        if not same:
            resident = Resident(
                key=ResidentKey(consumer, model.model, ANY_OPTIONS),
                gpu=gpu,
                bytes=model.size if model.bytes is None else model.bytes,
                priority=model.priority,
                policy=model.policy,
                idle_ttl=model.idle_ttl,
                last_used=now,
                changed_at=now,
                reload_seconds=model.reload_seconds,
                out_of_band=True,
            )
            books.residents[resident.key] = resident
            effects.append(
                resident_event(
                    EventKind.OUT_OF_BAND_RESIDENT, now, resident, "loaded without a lease"
                )
            )
            same = [resident]
        for resident in same:
            if resident.state is not ResidentState.RESIDENT or model.bytes is None:
                continue
            if resident.bytes != model.bytes:
                effects.append(
                    resident_event(
                        EventKind.ENVELOPE_MEASURED,
                        now,
                        resident,
                        f"accounted {resident.bytes} bytes, the runtime reports {model.bytes}",
                        nbytes=model.bytes,
                    )
                )
                resident.bytes = model.bytes
            if model.bytes < model.size and not resident.offload_reported:
                resident.offload_reported = True
                effects.append(_offload_event(model, resident, now))
    return effects


def _offload_event(model: ListedModel, resident: Resident, now: float) -> Event:
    """Part of a load on the CPU, or all of it (size_vram 0 is a CPU load, not 100 % offload)."""
    if model.bytes == 0:
        return resident_event(
            EventKind.CPU_ONLY, now, resident, f"all {model.size} bytes on the CPU, none on the GPU"
        )
    return resident_event(
        EventKind.PARTIAL_OFFLOAD,
        now,
        resident,
        f"{model.bytes} of {model.size} bytes on the GPU, the rest on the CPU",
    )
