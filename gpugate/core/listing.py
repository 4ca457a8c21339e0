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
    gpus: Sequence[int],
    listed: Sequence[ListedModel],
    *,
    asked_at: float,
    now: float,
    found_on: int | None = None,
) -> list[Effect]:
    """Change the books to agree with the listing of a consumer on `gpus` (the runtime
    does not say which GPU a model is on: one found without a lease is put on `found_on`,
    the GPU whose memory the books do not explain, else the first); returns what to record."""
    for done in [k for k, at in books.unloaded_at.items() if k[0] == consumer and at < asked_at]:
        # A listing asked after an unload ended says the truth about that model again.
        del books.unloaded_at[done]
    cards = set(gpus)
    residents = [r for r in books.residents.values() if r.gpu in cards]
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
                gpu=gpus[0] if found_on is None else found_on,
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
        reported = _per_part(same, model.bytes)
        for resident in same:
            if resident.state is not ResidentState.RESIDENT or model.bytes is None:
                continue
            nbytes = reported[resident.key]
            if resident.bytes != nbytes:
                effects.append(
                    resident_event(
                        EventKind.ENVELOPE_MEASURED,
                        now,
                        resident,
                        f"accounted {resident.bytes} bytes, the runtime reports {nbytes}"
                        + ("" if nbytes == model.bytes else f" of its {model.bytes}"),
                        nbytes=nbytes,
                    )
                )
                resident.bytes = nbytes
            if model.bytes < model.size and not resident.offload_reported:
                resident.offload_reported = True
                effects.append(_offload_event(model, resident, now))
    return effects


def _per_part(same: Sequence[Resident], nbytes: int | None) -> dict[ResidentKey, int]:
    """What the runtime's figure for a model means for each resident of it: all of it for
    a model on one GPU; for a split one, shared among its parts as the books share it
    (the listing gives one figure for all its GPUs)."""
    if nbytes is None:
        return {}
    parts = [r for r in same if r.key.part is not None and r.state is ResidentState.RESIDENT]
    if len(parts) < 2:
        return {r.key: nbytes for r in same}
    counted = sum(r.bytes for r in parts) or len(parts)
    shares: dict[ResidentKey, int] = {}
    left = nbytes
    for index, part in enumerate(parts):
        share = left if index == len(parts) - 1 else nbytes * (part.bytes or 1) // counted
        shares[part.key] = share
        left -= share
    return {r.key: shares.get(r.key, nbytes) for r in same}


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
