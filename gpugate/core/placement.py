"""Placement: which of its consumer's GPUs a load goes to, or how it is split across them.

A consumer may use several GPUs. Who picks among them differs by runtime:

* the gate picks (`Placing.GATE`): a process runtime is started with the GPU it is given
  (CUDA_VISIBLE_DEVICES); the gate takes the GPU whose load needs the fewest and cheapest
  evictions, and among equals the one with the most room;
* the runtime picks (`Placing.RUNTIME`), by a rule of its own over the free memory it
  sees (Ollama: one GPU where the model fits, the one with the most free memory, else split
  across all of them). The runtime's package gives that rule as a `PlacementRule`; the gate
  leases where the rule says the runtime will load. When the rule would split but the model
  fits on one GPU once idle residents there are evicted, the gate evicts there instead: the
  runtime then finds that GPU the only one it fits on, and loads it whole.

Read-only and pure like capacity (`assess` is what it weighs each GPU with); the gate
submits the demands it returns.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from typing import Protocol

import attrs

from gpugate.core.capacity import Ask, Assessment, Verdict, assess
from gpugate.core.planner import PlanKind
from gpugate.core.residents import ResidentKey, ResidentState
from gpugate.core.state import GateCore
from gpugate.core.tickets import Demand
from gpugate.core.views import evictable_now

__all__ = ["Card", "Placement", "PlacementRule", "Placing", "Share", "place"]


class Placing(enum.Enum):
    """Who chooses the GPU a load goes to."""

    GATE = "gate"
    """The gate does, and tells the runtime (a process started on that GPU)."""
    RUNTIME = "runtime"
    """The runtime does, by its `PlacementRule`; the gate predicts it."""


@attrs.frozen
class Card:
    """One GPU as a runtime sees it when it places a load."""

    gpu: int
    total: int
    free: int
    """What the runtime will find free there (`cards`)."""


@attrs.frozen
class Share:
    """Bytes of one load on one GPU."""

    gpu: int
    bytes: int


class PlacementRule(Protocol):
    """A runtime's own rule for where a load of `nbytes` goes, given its GPUs as it sees
    them (in its own order). None: it fits nowhere as the runtime sees it (it would load
    anyway, partly on the CPU, or fail)."""

    def place(self, nbytes: int, cards: Sequence[Card]) -> tuple[Share, ...] | None: ...


@attrs.frozen
class Placement:
    """Where a demand is leased: one share (one GPU) or a share per GPU it spans."""

    shares: tuple[Share, ...]
    why: str
    predicted: bool = False
    """The runtime chooses, and this is the gate's prediction of its choice."""

    @property
    def split(self) -> bool:
        return len(self.shares) > 1

    def demands(self, demand: Demand) -> tuple[Demand, ...]:
        """The demands to submit, in GPU order (a split's parts are acquired in that order
        by everyone, so two splits never each hold a part the other waits for)."""
        if not self.split:
            share = self.shares[0]
            return (attrs.evolve(demand, gpu=share.gpu),)
        return tuple(
            attrs.evolve(demand, gpu=share.gpu, envelope=share.bytes, key=demand.key.on(share.gpu))
            for share in sorted(self.shares, key=lambda s: s.gpu)
        )


def place(
    core: GateCore,
    demand: Demand,
    gpus: Sequence[int],
    now: float,
    *,
    placing: Placing = Placing.GATE,
    rule: PlacementRule | None = None,
) -> Placement:
    """Where `demand` goes among `gpus` (its consumer's GPUs, in the runtime's order)."""
    whole = demand.key.whole
    if len(gpus) <= 1:
        gpu = gpus[0] if gpus else demand.gpu
        return Placement((Share(gpu, demand.envelope),), "its only GPU")
    held = _held(core, demand)
    if held is not None:
        return held
    if placing is Placing.RUNTIME and rule is not None:
        return _predicted(core, demand, gpus, rule, now)
    assessments = {g: _assess(core, demand, g, now) for g in gpus}
    best = _cheapest(core, gpus, assessments)
    if best is None:
        return Placement((Share(gpus[0], demand.envelope),), f"no GPU has room for {whole} now")
    return Placement((Share(best, demand.envelope),), _why(best, assessments[best]))


def cards(core: GateCore, gpus: Sequence[int], consumer: str) -> list[Card]:
    """The GPUs as `consumer`'s runtime would see them when it loads (those with a sample):
    NVML's figures, with what the books know is there that a sample may not show yet (a
    load that just completed) and the loads of its own still under way; another runtime's
    load leased but not begun is not there for it to see."""
    seen: list[Card] = []
    for gpu in gpus:
        budget = core.budget(gpu)
        if budget is None:
            continue
        used = budget.external_total
        for row in budget.consumers:
            used += max(row.observed, row.resident + row.unexplained)
            if row.name == consumer:
                used += row.pending
        seen.append(Card(gpu, budget.total, max(0, budget.total - budget.reserved - used)))
    return seen


def _held(core: GateCore, demand: Demand) -> Placement | None:
    """A model resident (or loading) already: its request goes where it is. One being
    unloaded too: its request waits there for the unload to end, as the runtime lets its
    runner go before it loads the model again (Ollama's scheduler unloads a runner under
    the lock its scheduling of the next request takes: sched.go `processCompleted`), and
    its load counts on the memory that unload gives back."""
    key = demand.key.whole
    books = core.books
    found, how = books.reusable(key), "is on"
    if found is None:
        exact = books.residents.get(key)
        if exact is not None and exact.state is ResidentState.LOADING:
            found = exact
        elif exact is not None and exact.state is ResidentState.UNLOADING:
            found, how = exact, "is being unloaded from"
    if found is not None:
        return Placement((Share(found.gpu, demand.envelope),), f"{key} {how} GPU {found.gpu}")
    parts = books.parts_of(key)
    if parts and all(p.state in (ResidentState.RESIDENT, ResidentState.LOADING) for p in parts):
        shares = tuple(Share(p.gpu, p.bytes) for p in sorted(parts, key=lambda p: p.gpu))
        gpus = ", ".join(str(s.gpu) for s in shares)
        return Placement(shares, f"{key} is split across GPUs {gpus}")
    return None


def _assess(core: GateCore, demand: Demand, gpu: int, now: float) -> Assessment:
    ask = Ask(
        key=demand.key,
        gpu=gpu,
        envelope=demand.envelope,
        priority=demand.priority,
        resident_priority=demand.resident_priority,
        policy=demand.policy,
        idle_ttl=demand.idle_ttl,
        reload_seconds=demand.reload_seconds,
    )
    return assess(core, ask, now)


_TAKES = (Verdict.RESIDENT, Verdict.FITS, Verdict.AFTER_EVICTION)
"""The verdicts of a card that takes the load now (at once, or once its evictions are done)."""


def _cost(core: GateCore, assessment: Assessment) -> tuple[int, float, int]:
    """How much an eviction plan takes away: how many residents, the seconds reloading them
    would cost, the bytes."""
    residents = core.books.residents
    victims = [residents[k] for k in assessment.victims if k in residents]
    return (
        len(victims),
        sum(v.reload_seconds for v in victims),
        sum(v.bytes for v in victims),
    )


def _cheapest(
    core: GateCore, gpus: Sequence[int], assessments: dict[int, Assessment]
) -> int | None:
    """The GPU that takes the load with the fewest and cheapest evictions (how many, the
    seconds reloading them would cost, their bytes), then the most room; None when none
    takes it now."""
    ranked = [
        (a.verdict.rank, *_cost(core, a), -(a.available or 0), index, gpu)
        for index, (gpu, a) in enumerate((g, assessments[g]) for g in gpus)
        if a.verdict in _TAKES
    ]
    if ranked:
        return min(ranked)[-1]
    # Nothing takes it now: queue where it would wait rather than where it fails.
    for gpu in gpus:
        if assessments[gpu].plan is PlanKind.WAIT:
            return gpu
    return None


def _why(gpu: int, assessment: Assessment) -> str:
    if assessment.verdict is Verdict.AFTER_EVICTION:
        names = ", ".join(str(k) for k in assessment.victims)
        return f"GPU {gpu} takes it after evicting {names}"
    if assessment.verdict is Verdict.NO_ROOM:
        return f"GPU {gpu}: it would wait there ({assessment.reason})"
    return f"GPU {gpu} has the most room for it"


def _after(core: GateCore, seen: Sequence[Card], a: Assessment) -> list[Card]:
    """The cards as the runtime will see them once `a`'s victims are unloaded (a split
    victim's other parts included: the runtime unloads a model whole)."""
    freed: dict[int, int] = {}
    books = core.books
    for key in a.victims:
        resident = books.residents.get(key)
        if resident is None:
            continue
        for gone in books.parts_of(key.whole) if key.part is not None else [resident]:
            freed[gone.gpu] = freed.get(gone.gpu, 0) + gone.bytes
    return [attrs.evolve(c, free=c.free + freed.get(c.gpu, 0)) for c in seen]


def _evictable_gone(core: GateCore, seen: Sequence[Card], demand: Demand, now: float) -> list[Card]:
    """The cards with every resident the demand may evict now gone (a split one's other
    parts with it)."""
    settings = core.settings.planner
    freed: dict[int, int] = {}
    counted: set[ResidentKey] = set()
    for card in seen:
        for resident in core.books.on_gpu(card.gpu):
            if resident.key in counted or not evictable_now(resident, demand, now, settings):
                continue
            parts = core.books.parts_of(resident.key.whole) if resident.key.part is not None else []
            for gone in parts or [resident]:
                counted.add(gone.key)
                freed[gone.gpu] = freed.get(gone.gpu, 0) + gone.bytes
    return [attrs.evolve(c, free=c.free + freed.get(c.gpu, 0)) for c in seen]


def _unmanaged(core: GateCore, seen: Sequence[Card]) -> list[Card]:
    """The cards with nothing of any consumer's on them: the most the runtime could ever
    find free there while external use stays as it is."""
    cards: list[Card] = []
    for card in seen:
        budget = core.budget(card.gpu)
        if budget is None:
            cards.append(card)
            continue
        free = budget.total - budget.reserved - budget.external_total
        cards.append(attrs.evolve(card, free=max(card.free, free)))
    return cards


def _split(shares: Sequence[Share], how: str) -> Placement:
    spans = ", ".join(f"GPU {s.gpu} {s.bytes}" for s in shares)
    return Placement(tuple(shares), f"the runtime splits it ({spans} bytes): {how}", predicted=True)


def _fits_now(core: GateCore, demand: Demand, shares: Sequence[Share], now: float) -> bool:
    """Whether every part of a split would be granted at once, nothing evicted."""
    for share in shares:
        part = attrs.evolve(demand, key=demand.key.on(share.gpu), envelope=share.bytes)
        if _assess(core, part, share.gpu, now).verdict not in (Verdict.FITS, Verdict.RESIDENT):
            return False
    return True


def _predicted(
    core: GateCore,
    demand: Demand,
    gpus: Sequence[int],
    rule: PlacementRule,
    now: float,
) -> Placement:
    """Where the runtime will load it, by its own rule over the memory it will see."""
    seen = cards(core, gpus, demand.consumer)
    if len(seen) < len(gpus):
        # A GPU without a sample: nothing can be predicted; submit where the rule is not
        # needed, and the core's own staleness answer follows.
        missing = next(g for g in gpus if g not in {c.gpu for c in seen})
        return Placement(
            (Share(missing, demand.envelope),), f"GPU {missing} has no sample", predicted=True
        )
    shares = rule.place(demand.envelope, seen)
    if shares is not None and len(shares) == 1:
        gpu = shares[0].gpu
        return Placement(
            (Share(gpu, demand.envelope),),
            f"the runtime loads it on GPU {gpu} (it fits there, with the most free memory)",
            predicted=True,
        )
    # The runtime would split it (or finds no room). A split that fits as it is evicts
    # nothing. Else, where evicting on one card (and the other parts of what it evicts
    # there) makes room, the runtime places it by the same rule over what it then sees:
    # whole on that card is best; a split, each part planned on its own card, next.
    if shares is not None and _fits_now(core, demand, shares, now):
        return _split(shares, "by the free memory it sees")
    # Only now weigh each card whole: what the runtime does as it is needed no eviction.
    assessments = {g: _assess(core, demand, g, now) for g in gpus}
    whole: list[tuple[tuple[int, float, int, int], int]] = []
    split_after: list[tuple[tuple[int, float, int, int], tuple[Share, ...]]] = []
    for index, gpu in enumerate(gpus):
        a = assessments[gpu]
        if a.verdict is not Verdict.AFTER_EVICTION:
            continue
        again = rule.place(demand.envelope, _after(core, seen, a))
        if again is None:
            continue
        cost = (*_cost(core, a), index)
        if len(again) == 1 and again[0].gpu == gpu:
            whole.append((cost, gpu))
        elif len(again) > 1:
            split_after.append((cost, tuple(again)))
    if whole:
        gpu = min(whole)[1]
        return Placement(
            (Share(gpu, demand.envelope),),
            _why(gpu, assessments[gpu]) + "; the runtime then loads it whole there",
            predicted=True,
        )
    if shares is not None:
        return _split(shares, "each card makes room for its part")
    if split_after:
        return _split(min(split_after)[1], "once the evictions for it are done")
    # No one card takes it even emptied of what it may evict: the runtime splits it over
    # the memory the evictions for its parts leave. Which ones the planner takes is decided
    # per part, so the shares are predicted over everything it could take, and the books
    # follow what the runtime reports once it is loaded.
    emptied = rule.place(demand.envelope, _evictable_gone(core, seen, demand, now))
    if emptied is not None and len(emptied) > 1:
        return _split(emptied, "over what the evictions for its parts leave")
    # Not now, whatever it may evict: where the runtime would put it on cards holding
    # nothing of the gate's, it waits (or fails) as the planner says there. A model no one
    # card can hold is split, each part waiting on its card.
    ideal = rule.place(demand.envelope, _unmanaged(core, seen))
    if ideal is not None and len(ideal) > 1:
        return _split(ideal, "each part waits for room on its card")
    if ideal is not None:
        gpu = ideal[0].gpu
        return Placement(
            (Share(gpu, demand.envelope),),
            f"the runtime would load it on GPU {gpu} once there is room",
            predicted=True,
        )
    best = _cheapest(core, gpus, assessments)
    gpu = gpus[0] if best is None else best
    return Placement(
        (Share(gpu, demand.envelope),),
        f"it fits on no GPU as the runtime sees them; leased on GPU {gpu}",
        predicted=True,
    )
