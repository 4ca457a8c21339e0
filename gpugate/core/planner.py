"""The planner: for one demand, grant now, evict these then grant, wait, or fail.

A pure function of the demand, the bytes still free for it (the pool left after every
earlier ticket in the queue took its share) and the residents on its GPU. It never
changes anything; the core state applies what it decides.
"""

from __future__ import annotations

import enum
from collections.abc import Collection, Sequence

import attrs

from gpugate.core.crowding import make_room
from gpugate.core.failures import FailureClass
from gpugate.core.residents import ANY_OPTIONS, Resident, ResidentKey, ResidentState
from gpugate.core.tickets import Demand
from gpugate.core.views import (
    PlannerSettings,
    ResidentSource,
    ResidentView,
    class_allows,
    evictable_now,
    release_time,
    victim_order,
)

__all__ = [
    "Plan",
    "PlanKind",
    "PlannerSettings",
    "ResidentSource",
    "ResidentView",
    "class_allows",
    "evictable_now",
    "plan",
    "release_time",
    "reusable",
    "same_model",
    "victim_order",
]


class PlanKind(enum.Enum):
    GRANT = "grant"
    EVICT = "evict"
    WAIT = "wait"
    FAIL = "fail"


@attrs.frozen
class Plan:
    kind: PlanKind
    needed: int
    """Bytes the demand adds to the budget (0 when its model is already resident)."""
    victims: tuple[ResidentKey, ...] = ()
    """EVICT: the residents to unload, in eviction order."""
    counting_on: tuple[ResidentKey, ...] = ()
    """WAIT/EVICT: residents whose bytes the demand expects to get; later tickets keep off."""
    eventual: int = 0
    """WAIT/EVICT: bytes those residents will free by the deadline."""
    earliest: float | None = None
    """When the demand could fit at the soonest (None: never, as far as anyone can tell)."""
    failure: FailureClass | None = None
    reason: str = ""


def same_model(resident: ResidentKey, demand: ResidentKey) -> bool:
    return resident.consumer == demand.consumer and resident.model == demand.model


def reusable(resident: ResidentKey, demand: ResidentKey) -> bool:
    """A request can use this loaded model without making the runtime reload it (a part of
    a split model serves only the same part: a demand for the whole model on one card
    replaces it)."""
    if not same_model(resident, demand) or resident.part != demand.part:
        return False
    return resident.options == demand.options or (
        resident.options == ANY_OPTIONS and demand.options == ""
    )


DEFAULT_SETTINGS = PlannerSettings()


def plan(
    demand: Demand,
    *,
    pool: int,
    residents: ResidentView | Sequence[Resident],
    schedulable: int | None = None,
    now: float,
    deadline: float,
    settings: PlannerSettings = DEFAULT_SETTINGS,
    claimed: Collection[ResidentKey] = frozenset(),
    releasable_unexplained: int = 0,
    may_evict: bool = True,
    held: Sequence[Resident] = (),
) -> Plan:
    """Decide for one demand.

    `pool` is what is schedulable for it after earlier tickets' shares (may be negative);
    `schedulable` is the GPU's schedulable bytes before those shares (default: `pool`),
    used to tell "never" from "not yet": earlier tickets hold their shares only for a while.
    `residents` are those on the demand's GPU (a `ResidentView` when many demands are
    planned at once). `claimed` residents are counted on by earlier waiting tickets and are
    not this demand's to take. `releasable_unexplained` is memory of this GPU's consumers
    the gate cannot name yet but will be able to reclaim once the runtime lists it. With
    `may_evict` false (its earlier unloads are still under way) the demand waits for those
    instead of choosing more victims on numbers that are moving under it. `held` are the
    consumer's other models its runtime counts against `Demand.most_models`
    (`crowding.held_by`): those the limit needs gone are evicted first.
    """
    view = (
        residents if isinstance(residents, ResidentView) else ResidentView(residents, now, settings)
    )
    same = view.same_model(demand.key)
    exact = [r for r in same if reusable(r.key, demand.key)]
    for resident in exact:
        if resident.state is ResidentState.RESIDENT:
            return Plan(PlanKind.GRANT, 0, reason=f"{resident.key} is resident")
    needed = demand.envelope
    if exact:
        state = exact[0].state.value
        if any(r.state is ResidentState.LOADING for r in exact):
            # Loading under another lease: this one rides on it and will add nothing, so
            # it keeps nothing back from the tickets behind it.
            return Plan(
                PlanKind.WAIT,
                0,
                counting_on=tuple(r.key for r in exact),
                earliest=now,
                reason=f"{exact[0].key} is {state}",
            )
        # Being unloaded: it must load again, into the bytes that unload gives back.
        return Plan(
            PlanKind.WAIT,
            needed,
            counting_on=tuple(r.key for r in exact),
            eventual=min(needed, sum(r.bytes for r in exact)),
            earliest=now,
            reason=f"{exact[0].key} is {state}",
        )

    # Another copy of the same model with other runner options: the runtime would replace
    # it anyway, so it goes first, whatever its class, once it is idle.
    replaced = [r for r in same if r.key not in claimed]
    if any(not r.idle for r in replaced):
        busy = [r for r in replaced if not r.idle]
        return Plan(
            PlanKind.WAIT,
            needed,
            counting_on=tuple(r.key for r in replaced),
            eventual=sum(r.bytes for r in replaced),
            earliest=now,
            reason=f"{busy[0].key} must be replaced and is {_busy_word(busy[0])}",
        )
    room = make_room(demand, held, claimed, now)
    if room.short:
        if room.earliest is None or room.earliest > deadline:
            never = room.earliest is None
            return Plan(
                PlanKind.FAIL,
                needed,
                earliest=room.earliest,
                failure=(
                    FailureClass.EVICTION_NOT_ALLOWED
                    if never
                    else FailureClass.DEADLINE_CANNOT_BE_MET
                ),
                reason=room.reason,
            )
        return Plan(
            PlanKind.WAIT,
            needed,
            counting_on=room.waiting_for,
            earliest=room.earliest,
            reason=room.reason,
        )
    forced = sorted([*replaced, *room.victims], key=victim_order)
    # Unloads already under way (for this demand, or for nobody in particular) bring their
    # bytes back soon: count them before choosing anyone else.
    unloading = [
        r for r in view.unloading if r.key not in claimed and not same_model(r.key, demand.key)
    ]
    incoming = sum(r.bytes for r in unloading)
    coming = tuple(r.key for r in unloading)

    if needed <= pool and not forced:
        return Plan(PlanKind.GRANT, needed, reason="fits")
    if (needed <= pool + incoming or not may_evict) and not forced:
        return Plan(
            PlanKind.WAIT,
            needed,
            counting_on=coming,
            eventual=incoming,
            earliest=now,
            reason="waiting for unloads under way",
        )

    victims = list(forced)
    # A model the runtime's limit makes go from another of its GPUs frees nothing here.
    freed = sum(r.bytes for r in forced if r.gpu == demand.gpu) + incoming
    if pool + freed < needed:
        taken = {r.key for r in forced}
        for resident in view.evictable(demand):
            if resident.key not in claimed and resident.key not in taken:
                victims.append(resident)
                freed += resident.bytes
                if pool + freed >= needed:
                    break
    if pool + freed >= needed:
        keys = tuple(r.key for r in victims)
        return Plan(
            PlanKind.EVICT,
            needed,
            victims=keys,
            counting_on=keys + coming,
            eventual=freed,
            earliest=now,
            reason=f"evict {', '.join(str(k) for k in keys)}",
        )

    # Not now. Could it ever fit, and before the deadline? Residents claimed by earlier
    # tickets still count for that question (they are earlier tickets' only for a while)
    # but not for what this one may expect to get.
    have = pool if schedulable is None else max(pool, schedulable)
    earliest: float | None = None
    if releasable_unexplained > 0 and have < needed:
        have += releasable_unexplained
        earliest = now
    counting: list[ResidentKey] = []
    eventual = max(0, releasable_unexplained)
    for when, nbytes, key in view.releases(demand):
        if have < needed:
            have += nbytes
            earliest = when
        if when <= deadline and key not in claimed:
            counting.append(key)
            eventual += nbytes
        elif have >= needed:
            break
    if have < needed:
        return Plan(
            PlanKind.FAIL,
            needed,
            failure=FailureClass.INSUFFICIENT_SCHEDULABLE_VRAM,
            reason="cannot fit even after everything evictable for its class is gone",
        )
    earliest = now if earliest is None else earliest
    if earliest > deadline:
        return Plan(
            PlanKind.FAIL,
            needed,
            earliest=earliest,
            failure=FailureClass.DEADLINE_CANNOT_BE_MET,
            reason="the memory it needs frees up only after its maximum wait",
        )
    return Plan(
        PlanKind.WAIT,
        needed,
        counting_on=tuple(counting),
        eventual=eventual,
        earliest=earliest,
        reason="waiting for memory to be released",
    )


def _busy_word(resident: Resident) -> str:
    if resident.state is ResidentState.RESIDENT:
        return f"serving {resident.in_flight} request(s)"
    return resident.state.value


def on_another_card(demand: Demand, copy: Resident | None) -> Resident | None:
    """`copy` (the books' entry for the demand's model) when it is on another of the
    consumer's GPUs than the demand's and the demand loads the model; else None."""
    if copy is None or copy.gpu == demand.gpu or not demand.loads_model:
        return None
    return copy


def elsewhere(demand: Demand, copy: Resident | None, now: float) -> Plan | None:
    """The model is resident, or loading, on another of its consumer's GPUs (`copy`, placed
    there after this ticket queued here): the runtime holds one copy of it, so that copy
    serves this request too — at once, or once it has loaded. Being unloaded there, it
    is waited for: the runtime loads the model again only once that copy has gone, and
    the books hold one entry per model."""
    copy = on_another_card(demand, copy)
    if copy is None:
        return None
    if copy.state is ResidentState.RESIDENT:
        return Plan(PlanKind.GRANT, 0, reason=f"{copy.key} is resident on GPU {copy.gpu}")
    motion = _ELSEWHERE_MOTION.get(copy.state)
    if motion is None:
        return None
    return Plan(
        PlanKind.WAIT,
        0,
        counting_on=(copy.key,),
        earliest=now,
        reason=f"{copy.key} is {motion} GPU {copy.gpu}",
    )


_ELSEWHERE_MOTION = {
    ResidentState.LOADING: "loading on",
    ResidentState.UNLOADING: "being unloaded from",
}
"""What a copy on another GPU is doing that a ticket waits for, as its reason says it."""
