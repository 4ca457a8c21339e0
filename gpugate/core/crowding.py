"""Room among a runtime's models: a runtime that holds at most so many models at once
(`Demand.most_models`, llama-server's `--models-max`) unloads one of its own choosing to
load another past it (its least recently used idle one: server-models.cpp `unload_lru`,
`server_lru_sched::pick_victim`). The books would then hold a model the runtime no longer
has. So the gate makes that room itself before the load: it evicts, by its own order and
class rules, as many of the consumer's other models as the limit needs, and the load goes
up only once they are gone. The runtime then finds a free slot and unloads nothing.

The runtime counts a model that is loading, or still stopping, as one it holds
(`is_running`: loaded, loading or sleeping; a stopped child leaves only once it exited),
so the books' loading and unloading residents count too. No equal-class grace applies:
the runtime itself would unload one at once, and the grace only keeps memory claims of
one class from taking turns.

Pure: no I/O, no clock (the moment is passed in).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

import attrs

from gpugate.core.residents import Resident, ResidentKey, ResidentState
from gpugate.core.tickets import Demand
from gpugate.core.views import class_allows, victim_order

HELD = frozenset({ResidentState.RESIDENT, ResidentState.LOADING, ResidentState.UNLOADING})
"""The states of a model its runtime counts as held (a suspect one it no longer lists)."""


@attrs.frozen
class Room:
    """What a demand's load needs of its consumer's other models."""

    victims: tuple[Resident, ...] = ()
    """To evict before the load (every part of each model)."""
    waiting_for: tuple[ResidentKey, ...] = ()
    """Models that must go first and cannot yet (busy, loading, still unloading, or not
    its class's to evict); empty: the load may go once `victims` are gone."""
    earliest: float | None = None
    """While waiting: when enough of them could be gone (None: never)."""
    reason: str = ""

    @property
    def short(self) -> bool:
        return bool(self.waiting_for)


def held_by(residents: Collection[Resident], demand: Demand) -> list[Resident]:
    """The consumer's other models its runtime counts as held, from the books (every GPU)."""
    if demand.most_models is None:
        return []
    return [
        r
        for r in residents
        if r.key.consumer == demand.consumer and r.key.model != demand.model and r.state in HELD
    ]


def make_room(
    demand: Demand, held: Sequence[Resident], claimed: Collection[ResidentKey], now: float
) -> Room:
    """The consumer's models to evict for `demand` (`held`: `held_by`'s), or what it
    waits for. `claimed` residents are counted on by earlier tickets."""
    limit = demand.most_models
    if limit is None:
        return Room()
    models: dict[str, list[Resident]] = {}
    for resident in held:
        models.setdefault(resident.key.model, []).append(resident)
    over = len(models) - max(limit, 1) + 1
    if over <= 0:
        return Room()
    going = [m for m, parts in models.items() if any(_going(r) for r in parts)]
    need = over - len(going)
    free = [
        parts
        for m, parts in models.items()
        if m not in going and all(_evictable(r, demand, claimed) for r in parts)
    ]
    free.sort(key=lambda parts: min(victim_order(r) for r in parts))
    chosen = free[: max(need, 0)]
    words = f"its runtime holds at most {limit} model(s)"
    if need <= 0:
        keys = tuple(r.key for m in going for r in models[m])
        return Room(waiting_for=keys, earliest=now, reason=f"{words}: waiting for unloads")
    if len(chosen) >= need:
        victims = tuple(r for parts in chosen for r in parts)
        return Room(
            victims=victims, reason=f"{words}: evict {', '.join(str(r.key) for r in victims)}"
        )
    # Not enough now: when could enough of them be gone?
    times = sorted(
        t
        for t in (_release(parts, demand, now) for m, parts in models.items() if m not in going)
        if t is not None
    )
    earliest = times[need - 1] if len(times) >= need else None
    keys = tuple(r.key for r in held)
    busy = f"{words} and {len(models)} are held, {need} of them not evictable now"
    return Room(waiting_for=keys, earliest=earliest, reason=busy)


def _going(resident: Resident) -> bool:
    return resident.state is ResidentState.UNLOADING


def _evictable(resident: Resident, demand: Demand, claimed: Collection[ResidentKey]) -> bool:
    return resident.idle and resident.key not in claimed and class_allows(resident, demand)


def _release(parts: Sequence[Resident], demand: Demand, now: float) -> float | None:
    """The soonest every part of a model could be evicted for the demand (None: never).
    A busy or loading one is assumed idle soon, as the planner assumes (`release_time`)."""
    latest = now
    for resident in parts:
        if class_allows(resident, demand):
            continue
        if resident.idle_ttl is None:
            return None
        expiry = resident.expires_at()
        latest = max(latest, expiry if expiry is not None else now + resident.idle_ttl)
    return latest
