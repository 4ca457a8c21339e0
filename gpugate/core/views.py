"""What the planner reads about one GPU's residents: who may take whose memory, when
it could come free, and the orders a queue pass shares between its tickets.

Pure, like the planner: no I/O, no clock (the moment is passed in).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence

import attrs

from gpugate.core.classes import PriorityClass, ResidencyPolicy
from gpugate.core.residents import Resident, ResidentKey, ResidentState
from gpugate.core.tickets import Demand


@attrs.frozen
class PlannerSettings:
    """How the planner and the queue weigh residents against waiting demands (the
    configuration's `queue` section)."""

    equal_class_grace: float = 30.0
    """An idle resident of the demand's own class may be evicted only after this long idle."""
    yield_after: float | None = None
    """An idle resident of a higher class (not `always_warm`, not production) may be evicted
    for a lower-class demand once it has been idle this long, before its TTL ends; None:
    only at its TTL."""
    swap_hold: float = 20.0
    """A demand for a loaded model goes ahead of an earlier one of its class that would evict
    that model, only while the earlier one has waited less than this long."""
    swap_overtakes: int = 8
    """... and only while the earlier one has been overtaken fewer times than this (0: FIFO,
    no demand goes ahead of one that would evict its model)."""
    swap_window: float = 300.0
    """A model evicted for a demand and loaded again within this many seconds is a swap."""


Standing = tuple[PriorityClass, bool]
"""What residents' verdicts on a demand depend on: its class, and whether it is a rewarm."""


def standing(demand: Demand) -> Standing:
    """The key under which verdicts on this demand are shared with others of its standing."""
    return (demand.priority, demand.rewarm)


def class_allows(resident: Resident, demand: Demand) -> bool:
    """May a demand of this class ever take this resident's memory (when it is idle)?"""
    if resident.policy is ResidencyPolicy.ALWAYS_WARM:
        return (
            demand.priority is PriorityClass.PRODUCTION
            and resident.priority < PriorityClass.PRODUCTION
        )
    return resident.priority <= demand.priority


def idle_wait(resident: Resident, demand: Demand, settings: PlannerSettings) -> float | None:
    """How long the resident must have been idle before the demand may evict it (None:
    never, while it holds its policy): 0 for a lower class, the equal-class grace for its
    own, `yield_after` for a higher class whose policy lets it yield."""
    if class_allows(resident, demand):
        return settings.equal_class_grace if resident.priority == demand.priority else 0.0
    return yields_after(resident, demand, settings)


def yields_after(resident: Resident, demand: Demand, settings: PlannerSettings) -> float | None:
    """`yield_after` for a higher-class resident the demand's class may not otherwise take
    (an `always_warm` or production one never yields this way, nor to a rewarm, for which
    nobody waits); None when it does not."""
    if (
        settings.yield_after is None
        or demand.rewarm
        or resident.policy is ResidencyPolicy.ALWAYS_WARM
    ):
        return None
    if resident.priority is PriorityClass.PRODUCTION:
        # What production keeps warm it keeps for its TTL.
        return None
    return settings.yield_after if resident.priority > demand.priority else None


def yielding(
    resident_of: Callable[[ResidentKey], Resident | None],
    keys: tuple[ResidentKey, ...],
    demand: Demand,
    now: float,
    settings: PlannerSettings,
) -> str:
    """For a wait's reason: the higher-class models it waits for (`keys`, looked up with
    `resident_of`) that yield to it once idle `yield_after`, and when."""
    notes = []
    for key in keys:
        resident = resident_of(key)
        if resident is None or resident.gpu != demand.gpu:
            continue
        after = yields_after(resident, demand, settings)
        if after is None:
            continue
        idle = resident.last_used if resident.idle else now
        notes.append(
            f"{key} ({resident.priority.label}) yields to it once idle {after:g}s "
            f"(yield_after): in {max(0.0, idle + after - now):.0f}s if it stays idle"
        )
    return "".join(f"; {note}" for note in notes)


def evictable_now(
    resident: Resident, demand: Demand, now: float, settings: PlannerSettings
) -> bool:
    """Idle, its policy allows it, and of lower class (equal: only after the idle grace;
    higher: only after `yield_after`)."""
    if not resident.idle:
        return False
    wait = idle_wait(resident, demand, settings)
    return wait is not None and (wait == 0 or now - resident.last_used >= wait)


def victim_order(resident: Resident) -> tuple[int, float, float]:
    """Lowest class first, then cheapest to reload per byte freed, then least recently used."""
    return (int(resident.priority), resident.reload_cost_per_byte(), resident.last_used)


def release_time(
    resident: Resident, demand: Demand, now: float, settings: PlannerSettings
) -> float | None:
    """The soonest this resident's bytes could be the demand's (None: not before shutdown).

    Requests in flight have no known end, so a busy resident is assumed to become idle
    now: the demand waits for it rather than giving up.
    """
    if resident.state is ResidentState.UNLOADING:
        return now
    wait = idle_wait(resident, demand, settings)
    if wait is not None and class_allows(resident, demand) and wait == 0:
        return now
    idle_since = resident.last_used if resident.idle else now
    grace = None if wait is None else max(now, idle_since + wait)
    if class_allows(resident, demand):
        return grace
    if resident.idle_ttl is None:
        return grace
    expiry = resident.expires_at()
    expiry = expiry if expiry is not None else now + resident.idle_ttl
    return expiry if grace is None else min(expiry, grace)


class ResidentSource:
    """The residents of one GPU, with what planning derives from them alone (no clock).

    Derived orders are computed on first use and kept for as long as the source lives:
    the caller makes a new source (or resets one) when the residents change.
    """

    def __init__(self, residents: Sequence[Resident] = ()) -> None:
        self._residents = residents
        self.reset()

    def reset(self) -> None:
        """Forget everything derived (the residents changed)."""
        self._by_model: dict[tuple[str, str], list[Resident]] | None = None
        self._victims: list[Resident] | None = None
        self._candidates: dict[tuple[Standing, PlannerSettings], list[tuple[Resident, float]]] = {}
        self._relative: dict[tuple[Standing, PlannerSettings], _Relative | None] = {}

    def all(self) -> Sequence[Resident]:
        return self._residents

    def same_model(self, key: ResidentKey) -> Sequence[Resident]:
        if self._by_model is None:
            self._by_model = {}
            for resident in self.all():
                model = (resident.key.consumer, resident.key.model)
                self._by_model.setdefault(model, []).append(resident)
        return self._by_model.get((key.consumer, key.model), [])

    def unloading(self) -> list[Resident]:
        return [r for r in self.all() if r.state is ResidentState.UNLOADING]

    def victim_order(self) -> list[Resident]:
        if self._victims is None:
            self._victims = sorted(self.all(), key=victim_order)
        return self._victims

    def candidates(self, demand: Demand, settings: PlannerSettings) -> list[tuple[Resident, float]]:
        """In victim order, the idle residents the demand's class may take, and how long
        each must have been idle first (the only part that depends on the clock)."""
        cached = self._candidates.get((standing(demand), settings))
        if cached is None:
            cached = []
            for resident in self.victim_order():
                wait = idle_wait(resident, demand, settings) if resident.idle else None
                if wait is not None:
                    cached.append((resident, wait))
            self._candidates[(standing(demand), settings)] = cached
        return cached

    def relative(self, demand: Demand, settings: PlannerSettings) -> _Relative | None:
        """The release schedule when every time in it is `now` plus a constant (None:
        some resident's time does not move with the clock)."""
        if (standing(demand), settings) in self._relative:
            return self._relative[(standing(demand), settings)]
        rows: list[tuple[float, int, int, ResidentKey]] = []
        for index, resident in enumerate(self.all()):
            offset = release_offset(resident, demand, settings)
            if offset is _ABSOLUTE:
                rows = []
                self._relative[(standing(demand), settings)] = None
                return None
            if offset is not None:
                rows.append((offset, index, resident.bytes, resident.key))  # type: ignore[arg-type]
        rows.sort(key=lambda row: (row[0], row[1]))
        offsets = sorted({row[0] for row in rows})
        gaps = [b - a for a, b in itertools.pairwise(offsets)]
        relative = _Relative(
            [(row[0], row[2], row[3]) for row in rows],
            min(gaps) if gaps else math.inf,
            max((abs(o) for o in offsets), default=0.0),
        )
        self._relative[(standing(demand), settings)] = relative
        return relative


@attrs.frozen
class _Relative:
    rows: list[tuple[float, int, ResidentKey]]
    """(offset from now, bytes, key), soonest first, ties in the residents' order."""
    gap: float
    """The smallest difference between two distinct offsets."""
    largest: float

    def at(self, now: float) -> list[tuple[float, int, ResidentKey]] | None:
        """The schedule at `now`; None when rounding could tie two distinct offsets (the
        order would then have to come from the residents' order)."""
        if self.gap <= 4 * math.ulp(abs(now) + self.largest):
            return None
        return [(now + offset, nbytes, key) for offset, nbytes, key in self.rows]


_ABSOLUTE = object()


def release_offset(
    resident: Resident, demand: Demand, settings: PlannerSettings
) -> float | object | None:
    """`release_time` minus now, when that does not depend on now; `_ABSOLUTE` otherwise."""
    if resident.state is ResidentState.UNLOADING:
        return 0
    wait = idle_wait(resident, demand, settings)
    if class_allows(resident, demand) and wait == 0:
        return 0
    if wait is not None and resident.idle:
        return _ABSOLUTE
    grace = None if wait is None else max(wait, 0.0)
    if class_allows(resident, demand) or resident.idle_ttl is None:
        return grace
    if resident.expires_at() is not None:
        return _ABSOLUTE
    return resident.idle_ttl if grace is None else min(resident.idle_ttl, grace)


class ResidentView:
    """The residents of one GPU at one moment, indexed for planning many demands.

    Built once per queue pass: lookups by model, the victim order and, per demand class,
    the sorted release schedule are shared by every ticket the pass plans. What does not
    depend on the clock lives in its `ResidentSource`, which outlives the moment.
    """

    def __init__(
        self,
        residents: Sequence[Resident] | ResidentSource,
        now: float,
        settings: PlannerSettings,
        *,
        version: int = 0,
    ) -> None:
        self.now = now
        self.version = version
        """The books' version it was built at; a change to the books makes it stale."""
        self.settings = settings
        if not isinstance(residents, ResidentSource):
            residents = ResidentSource(residents)
        self.source = residents
        self._unloading: list[Resident] | None = None
        self._evictable: dict[Standing, list[Resident]] = {}
        self._releases: dict[Standing, list[tuple[float, int, ResidentKey]]] = {}

    @property
    def unloading(self) -> list[Resident]:
        if self._unloading is None:
            self._unloading = self.source.unloading()
        return self._unloading

    def same_model(self, key: ResidentKey) -> Sequence[Resident]:
        return self.source.same_model(key)

    def evictable(self, demand: Demand) -> list[Resident]:
        """The residents the demand could evict now, in victim order."""
        cached = self._evictable.get(standing(demand))
        if cached is None:
            cached = [
                r
                for r, wait in self.source.candidates(demand, self.settings)
                if wait == 0 or self.now - r.last_used >= wait
            ]
            self._evictable[standing(demand)] = cached
        return cached

    def releases(self, demand: Demand) -> list[tuple[float, int, ResidentKey]]:
        """(when, bytes, key) for every resident that can ever be the demand's, soonest first."""
        cached = self._releases.get(standing(demand))
        if cached is None:
            relative = self.source.relative(demand, self.settings)
            cached = None if relative is None else relative.at(self.now)
            if cached is None:
                cached = []
                for resident in self.source.all():
                    when = release_time(resident, demand, self.now, self.settings)
                    if when is not None:
                        cached.append((when, resident.bytes, resident.key))
                cached.sort(key=lambda item: item[0])
            self._releases[standing(demand)] = cached
        return cached
