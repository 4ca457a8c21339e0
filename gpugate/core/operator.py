"""Operator actions: evict a resident, drain a consumer, pause admission on a GPU.

Pure like the rest of the core: the books change, effects come back. Who asked is a
name the control API gives (an identity, or "token" for a control token) and is carried
into each event's detail, so the event log says who did what.
"""

from __future__ import annotations

import enum

import attrs

from gpugate.core.classes import ResidencyPolicy
from gpugate.core.effects import Effect, Event, EventKind, UnloadReason
from gpugate.core.residents import ResidentKey, ResidentState


class Refusal(enum.Enum):
    """Why an operator's eviction was refused."""

    UNKNOWN = "unknown"
    """No such resident."""
    ALWAYS_WARM = "always_warm"
    """Its policy keeps it loaded; `force` overrides."""
    BUSY = "busy"
    """In flight, or not in the RESIDENT state (loading, unloading, suspect)."""


class EvictionRefused(Exception):
    """The core would not evict: `refusal` says why, the message says it to a person."""

    def __init__(self, refusal: Refusal, message: str) -> None:
        super().__init__(message)
        self.refusal = refusal


@attrs.define
class OperatorBook:
    """What operators have asked for that the scheduler must keep honouring."""

    draining: set[str] = attrs.field(factory=set)
    drained: set[str] = attrs.field(factory=set)
    """Draining consumers whose `consumer_drained` event has been recorded."""
    paused: set[int] = attrs.field(factory=set)
    marks: dict[int | str, Mark] = attrs.field(factory=dict)
    """Since when, and by whom, each pause (by GPU) and drain (by consumer) in force."""


@attrs.frozen
class Mark:
    """When an operator action took effect (the core's clock) and who asked for it."""

    since: float
    by: str


def refuse_eviction(
    key: ResidentKey,
    policy: ResidencyPolicy | None,
    state: ResidentState | None,
    in_flight: int,
    *,
    force: bool,
) -> EvictionRefused | None:
    """Why an operator may not evict `key` now (None: it may)."""
    if policy is None or state is None:
        return EvictionRefused(Refusal.UNKNOWN, f"no resident {key}")
    if policy is ResidencyPolicy.ALWAYS_WARM and not force:
        return EvictionRefused(
            Refusal.ALWAYS_WARM, f"{key} is always_warm: evict it with force to unload it anyway"
        )
    if in_flight > 0:
        return EvictionRefused(Refusal.BUSY, f"{key} is serving {in_flight} request(s)")
    if state is not ResidentState.RESIDENT:
        return EvictionRefused(Refusal.BUSY, f"{key} is {state.value}, not resident")
    return None


def action_event(kind: EventKind, now: float, who: str, detail: str, **fields: object) -> Event:
    """An operator action's event; its detail names who asked."""
    return Event(
        kind, now, detail=f"{detail}; asked by {who}", reason=UnloadReason.OPERATOR.value, **fields
    )  # type: ignore[arg-type]


def drained_events(book: OperatorBook, holding: set[str], now: float) -> list[Effect]:
    """`consumer_drained` for each draining consumer that holds no lease any more (once)."""
    effects: list[Effect] = []
    for consumer in sorted(book.draining - book.drained - holding):
        book.drained.add(consumer)
        effects.append(
            Event(
                EventKind.CONSUMER_DRAINED,
                now,
                consumer=consumer,
                detail=f"{consumer} is draining and holds no lease any more",
            )
        )
    return effects
