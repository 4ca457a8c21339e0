"""No load ever sees another lease's bytes as free: a hypothesis state machine over the
decision core with holders that size themselves (`gpugate.core.floors`).

One 16 GiB card (434 MiB the driver's, a 1 GiB reserve), three consumers: `ollama`, whose
loads take what their lease says (fixed holders), and `comfy` and `fit`, whose loads take
what they see free, less their own reserve (ComfyUI's `--reserve-vram`, set to the gate's
reserve), up to their ceiling (elastic holders; ComfyUI's partial load, llama-server's
`--fit`), some with a floor they run degraded in, and one `always_warm` model that makes
the largest ceilings impossible once it is loaded. The world is the card as NVML would show
it: a load allocates its bytes some time after its grant, an elastic one in steps while it
loads (it grows), a completed load keeps what it took until it is unloaded, and an external
process (Plex) grows and shrinks. After every step:

* a step that granted bytes never left committed + external + reserve above the card;
* no allocation of a grant fails for lack of free memory (starved) unless external use grew
  while it was loading: a holder that grew never took another grant's bytes;
* every lease belongs to a request still in flight, every waiting ticket to a client still
  waiting (and at the end nothing is left);
* no ticket of a higher class that fits in what the card offers waits while a lower class
  was granted bytes (a self-sizing load that waits for another lease to allocate is
  waiting for that, not for memory).
"""

from __future__ import annotations

import attrs
import hypothesis.strategies as st
from hypothesis import HealthCheck, settings
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from gpugate.core.classes import PriorityClass, ResidencyPolicy
from gpugate.core.effects import Event, EventKind, Grant, Reject, Unload
from gpugate.core.floors import unallocated
from gpugate.core.residents import ResidentKey
from gpugate.core.tickets import Lease, Sizing
from gpugate.core.units import GiB
from tests.core.builders import (
    RESERVED,
    TOTAL,
    assert_sums_recounted,
    demand,
    gpu,
    host,
    make_core,
    proc,
)

P = PriorityClass
RESERVE = 1 * GiB


@attrs.frozen
class Model:
    consumer: str
    name: str
    ceiling: int
    klass: PriorityClass
    floor: int | None = None
    warm: bool = False
    """`always_warm`: once loaded, it stays (whisper-server in the demo)."""
    ttl: float | None = 20.0
    """Its idle ttl; None: a class above a demand's keeps it for good."""

    @property
    def elastic(self) -> bool:
        return self.consumer != "ollama"


WARM = Model("ollama", "w", 2 * GiB, P.INTERACTIVE, warm=True)
"""Loaded from the start and kept (the demo's whisper-server): the largest ceilings can never
be had beside it, so their demands are granted their floors."""
MODELS = (
    Model("ollama", "a", 1 * GiB, P.BACKGROUND),
    Model("ollama", "b", 3 * GiB, P.INTERACTIVE),
    Model("ollama", "c", 6 * GiB, P.PRODUCTION, ttl=None),
    Model("comfy", "flux", 13 * GiB, P.INTERACTIVE, floor=5 * GiB),
    Model("comfy", "sd", 4 * GiB, P.BACKGROUND, floor=2 * GiB),
    Model("fit", "llm", 9 * GiB, P.PRODUCTION, floor=3 * GiB),
    Model("fit", "tiny", 2 * GiB, P.INTERACTIVE),
)


@attrs.define
class Load:
    """A lease's load as the card sees it."""

    lease: Lease
    elastic: bool
    ceiling: int
    taken: int = 0
    excused: bool = False
    """External use grew while it loaded: a failed allocation is not the gate's doing."""


class ElasticWorld(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.core = make_core(
            reserve=RESERVE,
            max_wait=30.0,
            queue_limit=3,
            grace=5.0,
            consumers=("ollama", "comfy", "fit"),
            reconcilable=(),
        )
        self.now = 0.0
        self.external = 0
        self.memory: dict[ResidentKey, int] = {}
        """What each model's runner holds on the card."""
        self.loads: dict[int, Load] = {}
        self.in_flight: set[int] = set()
        self.waiting: dict[int, Model] = {}
        self.unloads: set[ResidentKey] = set()
        self._sample()
        self.request(WARM, P.INTERACTIVE)
        (warm,) = self.loads
        self._allocate(self.loads[warm])
        self._apply(self.core.loaded(warm, self.now))
        del self.loads[warm]
        self.request_ends_for(warm)

    # -- the card ----------------------------------------------------------------------

    @property
    def free(self) -> int:
        return TOTAL - RESERVED - sum(self.memory.values()) - self.external

    def _sample(self) -> None:
        held: dict[str, int] = {}
        for key, nbytes in self.memory.items():
            held[key.consumer] = held.get(key.consumer, 0) + nbytes
        processes = [proc(10 + i, n, c) for i, (c, n) in enumerate(sorted(held.items())) if n]
        if self.external:
            processes.append(proc(500, self.external, "plex", managed=False))
        self._apply(self.core.observe(host(gpu(*processes), at=self.now), self.now))

    def _started(self, lease: Lease) -> None:
        self.in_flight.add(lease.id)
        if lease.pending:
            model = next(m for m in (WARM, *MODELS) if m.name == lease.key.model)
            self.loads[lease.id] = Load(lease, model.elastic, model.ceiling)

    def _apply(self, effects) -> None:
        granted = []
        for effect in effects:
            if isinstance(effect, Grant):
                assert effect.ticket_id in self.waiting, "granted a ticket nobody waits on"
                del self.waiting[effect.ticket_id]
                self._started(effect.lease)
                granted.append(effect.lease)
            elif isinstance(effect, Reject):
                assert effect.ticket_id in self.waiting, "rejected a ticket nobody waits on"
                del self.waiting[effect.ticket_id]
            elif isinstance(effect, Unload):
                self.unloads.add(effect.key)
            elif isinstance(effect, Event) and effect.kind is EventKind.DEGRADED:
                model = next(m for m in MODELS if m.name == effect.model)
                assert model.floor is not None, "degraded a demand without a floor"
                # Its floor, or the most it could ever have between floor and ceiling.
                assert effect.bytes is not None and effect.ceiling == model.ceiling
                assert model.floor <= effect.bytes < model.ceiling
        self._check_step(granted)

    def _check_step(self, granted: list[Lease]) -> None:
        budget = self.core.budget(0)
        assert budget is not None
        positive = [lease for lease in granted if lease.pending > 0]
        if not positive:
            return
        total = budget.committed_total + budget.external_total + budget.reserve + RESERVED
        assert total <= TOTAL, "a grant over-committed the card"
        room = budget.schedulable - self.core.scheduler.headroom(0)
        seen: set[ResidentKey] = set()
        for ticket in self.core.waiting(0):
            wanted = ticket.demand
            riding = wanted.key in seen or any(r.key == wanted.key for r in self.core.residents(0))
            seen.add(wanted.key)
            if wanted.sizing is Sizing.FITS_FREE and unallocated(budget):
                # It may wait for another lease to allocate, keeping its need back.
                room -= wanted.envelope
                continue
            if riding:
                continue
            lower = sum(x.pending for x in positive if x.demand.priority < wanted.priority)
            if lower:
                assert wanted.envelope > room + lower, (
                    f"{wanted.key} ({wanted.priority.label}) waits although it fits in what "
                    "lower classes were just given"
                )

    # -- rules -------------------------------------------------------------------------

    @rule(model=st.sampled_from(MODELS), klass=st.sampled_from(list(P)))
    def request(self, model: Model, klass: PriorityClass) -> None:
        wanted = attrs.evolve(
            demand(
                model.name,
                model.ceiling,
                consumer=model.consumer,
                priority=klass,
                resident_priority=model.klass,
                policy=ResidencyPolicy.ALWAYS_WARM if model.warm else ResidencyPolicy.KEEP_WARM,
                ttl=None if model.warm else model.ttl,
            ),
            floor=model.floor,
            sizing=Sizing.FITS_FREE if model.elastic else Sizing.FIXED,
        )
        admission = self.core.submit(wanted, self.now)
        if admission.waiting:
            self.waiting[admission.ticket_id] = model
        self._apply(admission.effects)
        if admission.lease is not None:
            self._started(admission.lease)
            self._check_step([admission.lease])

    @precondition(lambda self: self.loads)
    @rule(data=st.data())
    def allocates(self, data) -> None:
        """A load allocates: a fixed one all its lease at once, an elastic one what it sees
        free less its reserve, up to its ceiling (again and again: it grows)."""
        self._allocate(self.loads[data.draw(st.sampled_from(sorted(self.loads)))])

    def _allocate(self, load: Load) -> None:
        granted = load.lease.pending
        if load.elastic:
            take = max(0, min(load.ceiling - load.taken, self.free - RESERVE))
            enough = load.taken + take >= granted
        else:
            take = max(0, granted - load.taken)
            enough = take <= self.free
        assert enough or load.excused, (
            f"{load.lease.key} was granted {granted} bytes and finds {self.free} free: "
            "another holder took them"
        )
        take = min(take, max(0, self.free))
        load.taken += take
        key = load.lease.key
        self.memory[key] = self.memory.get(key, 0) + take
        self._sample()

    @precondition(lambda self: any(x.taken >= x.lease.pending for x in self.loads.values()))
    @rule(data=st.data())
    def load_completes(self, data) -> None:
        done = sorted(i for i, x in self.loads.items() if x.taken >= x.lease.pending)
        lease_id = data.draw(st.sampled_from(done))
        del self.loads[lease_id]
        self._apply(self.core.loaded(lease_id, self.now))

    @precondition(lambda self: self.in_flight)
    @rule(data=st.data())
    def request_ends(self, data) -> None:
        """A request ends; one whose load had not completed failed, and its runner let go
        of what it had taken."""
        self.request_ends_for(data.draw(st.sampled_from(sorted(self.in_flight))))

    def request_ends_for(self, lease_id: int) -> None:
        self.in_flight.discard(lease_id)
        load = self.loads.pop(lease_id, None)
        if load is not None:
            self.memory.pop(load.lease.key, None)
        self._apply(self.core.release(lease_id, self.now, failed=load is not None))

    @precondition(lambda self: self.waiting)
    @rule(data=st.data())
    def client_gives_up(self, data) -> None:
        ticket_id = data.draw(st.sampled_from(sorted(self.waiting)))
        del self.waiting[ticket_id]
        self._apply(self.core.cancel(ticket_id, self.now))

    @precondition(lambda self: self.unloads)
    @rule(data=st.data())
    def unload_finishes(self, data) -> None:
        key = data.draw(st.sampled_from(sorted(self.unloads)))
        self.unloads.discard(key)
        self.memory.pop(key, None)
        self._sample()
        self._apply(self.core.unloaded(key, self.now, reclaimed=True))

    @rule(delta=st.sampled_from((0, -1, 1, -2, 2)))
    def external_changes(self, delta: int) -> None:
        before = self.external
        self.external = max(0, min(4 * GiB, min(self.free + before, before + delta * GiB // 2)))
        if self.external > before:
            for load in self.loads.values():
                load.excused = True
        self._sample()

    @rule(seconds=st.floats(min_value=0.1, max_value=12.0))
    def time_passes(self, seconds: float) -> None:
        self.now += seconds
        self._sample()
        self._apply(self.core.tick(self.now))

    # -- invariants --------------------------------------------------------------------

    @invariant()
    def carried_sums_are_a_recount(self):
        assert_sums_recounted(self.core)

    @invariant()
    def leases_belong_to_live_requests(self) -> None:
        assert {x.id for x in self.core.leases()} == self.in_flight

    @invariant()
    def tickets_belong_to_waiting_clients(self) -> None:
        assert {t.id for t in self.core.waiting()} == set(self.waiting)

    def teardown(self) -> None:
        while self.waiting:
            ticket_id = min(self.waiting)
            del self.waiting[ticket_id]
            self._apply(self.core.cancel(ticket_id, self.now))
        while self.in_flight:
            lease_id = min(self.in_flight)
            self.in_flight.discard(lease_id)
            self._apply(self.core.release(lease_id, self.now))
        assert self.core.leases() == []
        assert self.core.waiting() == []


TestElasticWorld = ElasticWorld.TestCase
TestElasticWorld.settings = settings(
    max_examples=400,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
