"""Capacity for routers in the core: each verdict, that asking changes nothing, and that
the verdict is what submitting the demand at once would do (hypothesis)."""

from __future__ import annotations

import copy

import hypothesis.strategies as st
import pytest
from hypothesis import HealthCheck, settings
from hypothesis.stateful import RuleBasedStateMachine, precondition, rule

from gpugate.core.capacity import Ask, Blocked, Verdict, assess
from gpugate.core.classes import PriorityClass, ResidencyPolicy
from gpugate.core.effects import Grant, Reject, Unload
from gpugate.core.observation import DriverFault
from gpugate.core.planner import PlanKind
from gpugate.core.residents import ResidentKey
from gpugate.core.state import GateCore
from gpugate.core.units import GiB
from tests.core.builders import WORLD_MODELS, demand, gpu, host, make_core, proc, world_sample

P = PriorityClass


def ask(
    model: str,
    envelope: int | None,
    *,
    priority: PriorityClass = P.INTERACTIVE,
    resident_priority: PriorityClass | None = None,
    ttl: float | None = 900.0,
) -> Ask:
    return Ask(
        key=ResidentKey("ollama", model),
        gpu=0,
        envelope=envelope,
        priority=priority,
        resident_priority=priority if resident_priority is None else resident_priority,
        policy=ResidencyPolicy.KEEP_WARM,
        idle_ttl=ttl,
    )


def fresh(external: int = 0, now: float = 0.0) -> GateCore:
    core = make_core()
    processes = [proc(500, external, "plex", managed=False)] if external else []
    core.observe(host(gpu(*processes), at=now), now)
    return core


def load(core: GateCore, model: str, envelope: int, now: float, **kw) -> int:
    """Load a model through a lease and end its request; returns the lease id."""
    admission = core.submit(demand(model, envelope, **kw), now)
    assert admission.lease is not None, admission
    core.loaded(admission.lease.id, now)
    core.release(admission.lease.id, now)
    return admission.lease.id


# 16 GiB card, 434 MiB driver reserved, 1 GiB reserve: about 14.6 GiB schedulable.


def test_an_empty_card_fits_a_model_and_says_what_is_left():
    core = fresh()
    schedulable = core.budget(0).schedulable
    result = assess(core, ask("m", 4 * GiB), 1.0)
    assert result.verdict is Verdict.FITS and result.plan is PlanKind.GRANT
    assert (result.needed, result.available, result.schedulable) == (
        4 * GiB,
        schedulable,
        schedulable,
    )


def test_a_loaded_model_is_resident_and_needs_nothing():
    core = fresh()
    load(core, "m", 4 * GiB, 1.0)
    result = assess(core, ask("m", 4 * GiB), 2.0)
    assert result.verdict is Verdict.RESIDENT and result.needed == 0


def test_a_model_being_loaded_counts_as_resident():
    core = fresh()
    admission = core.submit(demand("m", 4 * GiB), 1.0)
    assert admission.lease is not None and admission.lease.pending
    result = assess(core, ask("m", 4 * GiB), 1.5)
    assert result.verdict is Verdict.RESIDENT and result.plan is PlanKind.WAIT
    assert result.reason == "loading"


def test_an_idle_lower_class_resident_makes_room_by_eviction():
    core = fresh()
    load(core, "big", 10 * GiB, 1.0, priority=P.BACKGROUND)
    result = assess(core, ask("m", 8 * GiB), 2.0)
    assert result.verdict is Verdict.AFTER_EVICTION and result.plan is PlanKind.EVICT
    assert result.victims == (ResidentKey("ollama", "big"),)
    assert result.freed == 10 * GiB


def test_an_equal_class_resident_is_a_victim_only_after_the_grace():
    core = fresh()
    load(core, "big", 10 * GiB, 1.0)
    assert assess(core, ask("m", 8 * GiB), 2.0).verdict is Verdict.NO_ROOM
    core.observe(host(gpu(), at=40.0), 40.0)
    assert assess(core, ask("m", 8 * GiB), 40.0).verdict is Verdict.AFTER_EVICTION


def test_what_is_never_evictable_for_the_class_leaves_no_room():
    core = fresh(external=6 * GiB)
    load(core, "big", 6 * GiB, 1.0, priority=P.PRODUCTION)
    result = assess(core, ask("m", 8 * GiB, priority=P.BACKGROUND), 2.0)
    assert result.verdict is Verdict.NO_ROOM and result.plan is PlanKind.FAIL
    assert result.blocked is None
    # A demand larger than the card can ever give.
    assert assess(core, ask("huge", 40 * GiB), 2.0).verdict is Verdict.NO_ROOM


def test_without_an_envelope_the_verdict_is_unknown_unless_resident():
    core = fresh()
    assert assess(core, ask("m", None), 1.0).verdict is Verdict.UNKNOWN
    load(core, "m", 2 * GiB, 1.0)
    assert assess(core, ask("m", None), 2.0).verdict is Verdict.RESIDENT


def test_operator_marks_and_stale_samples_block_admission():
    core = fresh()
    load(core, "m", 2 * GiB, 1.0)
    core.operator.pause(0, 2.0)
    for model in ("m", "n"):
        result = assess(core, ask(model, 1 * GiB), 2.0)
        assert (result.verdict, result.blocked) == (Verdict.NO_ROOM, Blocked.PAUSED)
    core.operator.resume(0, 2.0)
    core.operator.drain("ollama", 2.0)
    result = assess(core, ask("m", 1 * GiB), 2.0)
    assert (result.verdict, result.blocked) == (Verdict.NO_ROOM, Blocked.DRAINING)
    core.operator.undrain("ollama", 2.0)
    # Samples go stale: a resident still serves, a load is refused.
    assert assess(core, ask("m", 1 * GiB), 30.0).verdict is Verdict.RESIDENT
    result = assess(core, ask("n", 1 * GiB), 30.0)
    assert (result.verdict, result.blocked) == (Verdict.NO_ROOM, Blocked.STALE)
    core.telemetry.fault = DriverFault(999, "NVML_ERROR_UNKNOWN", "it broke")
    result = assess(core, ask("n", 1 * GiB), 2.0)
    assert (result.verdict, result.blocked) == (Verdict.NO_ROOM, Blocked.DRIVER_ERROR)


def test_a_full_queue_turns_an_eviction_into_no_room():
    core = make_core(queue_limit=1)
    core.observe(host(gpu(), at=0.0), 0.0)
    load(core, "victim", 4 * GiB, 0.0, priority=P.BACKGROUND)
    busy = core.submit(demand("busy", 6 * GiB, priority=P.MAINTENANCE), 0.0)
    assert busy.lease is not None
    core.loaded(busy.lease.id, 0.0)
    # The consumer's one queue place is taken: a maintenance load waits for the busy model.
    assert core.submit(demand("w", 10 * GiB, priority=P.MAINTENANCE), 0.0).waiting
    result = assess(core, ask("m", 5 * GiB), 0.0)
    assert (result.verdict, result.plan, result.blocked) == (
        Verdict.NO_ROOM,
        PlanKind.EVICT,
        Blocked.QUEUE_FULL,
    )
    admission = copy.deepcopy(core).submit(demand("m", 5 * GiB), 0.0)
    assert admission.failure is not None
    assert admission.failure.failure_class.value == "QUEUE_FULL"


def test_tickets_ahead_keep_their_share_and_those_behind_do_not():
    core = fresh()
    # An interactive load waits for a busy background model: the part of its need that
    # model will not cover (12 - 8 GiB) is kept back from the demands behind it.
    busy = core.submit(demand("busy", 8 * GiB, priority=P.BACKGROUND), 0.0)
    assert busy.lease is not None
    core.loaded(busy.lease.id, 0.0)
    assert core.submit(demand("head", 12 * GiB), 0.0).waiting
    schedulable = core.budget(0).schedulable
    for klass, verdict, available in (
        (P.BACKGROUND, Verdict.NO_ROOM, schedulable - 4 * GiB),  # behind the head
        (P.INTERACTIVE, Verdict.NO_ROOM, schedulable - 4 * GiB),  # same class, later
        (P.PRODUCTION, Verdict.FITS, schedulable),  # ahead of it
    ):
        result = assess(core, ask("m", 4 * GiB, priority=klass), 0.0)
        assert (result.verdict, result.available) == (verdict, available), klass
        admission = copy.deepcopy(core).submit(demand("m", 4 * GiB, priority=klass), 0.0)
        assert (admission.lease is not None) == (verdict is Verdict.FITS)


def test_asking_changes_nothing():
    core = fresh()
    load(core, "big", 10 * GiB, 1.0, priority=P.BACKGROUND)
    core.submit(demand("head", 13 * GiB, priority=P.PRODUCTION), 2.0)
    before = (core.books.version, core.books.residents_version, len(core.waiting()))
    residents = [(r.key, r.state, r.in_flight) for r in core.residents()]
    for model, size in (("big", 10 * GiB), ("m", 2 * GiB), ("n", 9 * GiB), ("x", None)):
        for klass in P:
            assess(core, ask(model, size, priority=klass), 2.0)
    assert (core.books.version, core.books.residents_version, len(core.waiting())) == before
    assert [(r.key, r.state, r.in_flight) for r in core.residents()] == residents


# -- the property: a verdict is what submitting would do ------------------------------------


def check(core: GateCore, model: tuple, klass: PriorityClass, now: float) -> Verdict:
    """Assess, then submit the same demand to a copy of the core at the same moment."""
    name, envelope, resident_class = model
    question = ask(name, envelope, priority=klass, resident_priority=resident_class, ttl=20.0)
    before = core.books.version
    result = assess(core, question, now)
    assert core.books.version == before, "assessing changed the books"
    copied = copy.deepcopy(core)
    admission = copied.submit(question.demand(), now)
    mine = admission.ticket_id
    unloads = [e for e in admission.effects if isinstance(e, Unload) and e.for_ticket == mine]
    if result.verdict is Verdict.RESIDENT:
        if result.plan is PlanKind.GRANT:
            assert admission.lease is not None and admission.lease.pending == 0
        else:
            assert admission.waiting and not unloads
    elif result.verdict is Verdict.FITS:
        assert admission.lease is not None, (result, admission.failure)
        assert admission.lease.pending == envelope and not unloads
    elif result.verdict is Verdict.AFTER_EVICTION:
        assert admission.failure is None and admission.lease is None, (result, admission)
        assert tuple(e.key for e in unloads) == result.victims
    elif result.verdict is Verdict.NO_ROOM:
        assert admission.lease is None, result
        assert not unloads, result
    return result.verdict


class CapacityWorld(RuleBasedStateMachine):
    """One 16 GiB card, five models, an external user; random requests, loads, releases,
    unloads, samples, time, pauses and drains. A `check` asks about a model and submits
    it to a copy of the core."""

    def __init__(self) -> None:
        super().__init__()
        self.core = make_core(max_wait=30.0, queue_limit=3, grace=5.0)
        self.now = 0.0
        self.external = 0
        self.materialised: dict[ResidentKey, int] = {}
        self.in_flight: set[int] = set()
        self.waiting: set[int] = set()
        self.unloads: dict[ResidentKey, Unload] = {}
        self.seen: set[Verdict] = set()
        self._sample()

    def _sample(self) -> None:
        runners = [proc(10 + i, b, "ollama") for i, b in enumerate(self.materialised.values())]
        observation = world_sample(self.core, runners, self.external, self.now)
        self._apply(self.core.observe(observation, self.now))

    def _apply(self, effects) -> None:
        for effect in effects:
            if isinstance(effect, Grant):
                self.waiting.discard(effect.ticket_id)
                self.in_flight.add(effect.lease.id)
            elif isinstance(effect, Reject):
                self.waiting.discard(effect.ticket_id)
            elif isinstance(effect, Unload):
                self.unloads[effect.key] = effect

    @rule(model=st.sampled_from(WORLD_MODELS), klass=st.sampled_from(list(P)))
    def request(self, model, klass):
        name, envelope, resident_class = model
        admission = self.core.submit(
            demand(name, envelope, priority=klass, resident_priority=resident_class, ttl=20.0),
            self.now,
        )
        if admission.waiting:
            self.waiting.add(admission.ticket_id)
        self._apply(admission.effects)
        if admission.lease is not None:
            self.in_flight.add(admission.lease.id)

    @rule(model=st.sampled_from(WORLD_MODELS), klass=st.sampled_from(list(P)))
    def check(self, model, klass):
        self.seen.add(check(self.core, model, klass, self.now))

    @precondition(lambda self: any(x.pending for x in self.core.leases()))
    @rule(data=st.data())
    def load_completes(self, data):
        lease = data.draw(st.sampled_from([x for x in self.core.leases() if x.pending]))
        self.materialised[lease.key] = lease.pending
        self._apply(self.core.loaded(lease.id, self.now))

    @precondition(lambda self: self.in_flight)
    @rule(data=st.data(), failed=st.booleans())
    def request_ends(self, data, failed):
        lease_id = data.draw(st.sampled_from(sorted(self.in_flight)))
        lease = self.core.lease(lease_id)
        if failed and lease is not None and lease.pending:
            self.materialised.pop(lease.key, None)
        self.in_flight.discard(lease_id)
        self._apply(self.core.release(lease_id, self.now, failed=failed))

    @precondition(lambda self: self.waiting)
    @rule(data=st.data())
    def client_gives_up(self, data):
        ticket_id = data.draw(st.sampled_from(sorted(self.waiting)))
        self.waiting.discard(ticket_id)
        self._apply(self.core.cancel(ticket_id, self.now))

    @precondition(lambda self: self.unloads)
    @rule(data=st.data(), reclaimed=st.booleans())
    def unload_finishes(self, data, reclaimed):
        key = data.draw(st.sampled_from(sorted(self.unloads)))
        del self.unloads[key]
        if reclaimed:
            self.materialised.pop(key, None)
            self._sample()
        self._apply(self.core.unloaded(key, self.now, reclaimed=reclaimed))

    @rule(delta=st.integers(min_value=-4, max_value=4))
    def external_changes(self, delta):
        self.external = max(0, min(6 * GiB, self.external + delta * GiB // 2))
        self._sample()

    @rule(seconds=st.floats(min_value=0.1, max_value=12.0), sample=st.booleans())
    def time_passes(self, seconds, sample):
        self.now += seconds
        if sample:
            self._sample()
        self._apply(self.core.tick(self.now))

    @rule(on=st.booleans())
    def operator_pauses(self, on):
        if on:
            self._apply(self.core.operator.pause(0, self.now))
        else:
            self._apply(self.core.operator.resume(0, self.now))

    @rule(on=st.booleans())
    def operator_drains(self, on):
        if on:
            self._apply(self.core.operator.drain("ollama", self.now))
        else:
            self._apply(self.core.operator.undrain("ollama", self.now))


TestCapacityWorld = CapacityWorld.TestCase
TestCapacityWorld.settings = settings(
    max_examples=120,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


@pytest.mark.parametrize("seed", range(3))
def test_every_verdict_is_reached_by_random_worlds(seed):
    """The worlds above reach each verdict (a property that never meets a verdict
    proves nothing about it)."""
    import random

    rng = random.Random(seed)
    seen: set[Verdict] = set()
    for _ in range(30):
        world = CapacityWorld()
        for _ in range(40):
            step = rng.randrange(6)
            if step == 0:
                world.request(rng.choice(WORLD_MODELS), rng.choice(list(P)))
            elif step == 1 and any(x.pending for x in world.core.leases()):
                lease = rng.choice([x for x in world.core.leases() if x.pending])
                world.materialised[lease.key] = lease.pending
                world._apply(world.core.loaded(lease.id, world.now))
            elif step == 2 and world.in_flight:
                lease_id = rng.choice(sorted(world.in_flight))
                world.in_flight.discard(lease_id)
                world._apply(world.core.release(lease_id, world.now))
            elif step == 3:
                world.now += rng.uniform(0.1, 12.0)
                world._sample()
                world._apply(world.core.tick(world.now))
            elif step == 4 and world.unloads:
                key = rng.choice(sorted(world.unloads))
                del world.unloads[key]
                world.materialised.pop(key, None)
                world._sample()
                world._apply(world.core.unloaded(key, world.now, reclaimed=True))
            else:
                seen.add(
                    check(world.core, rng.choice(WORLD_MODELS), rng.choice(list(P)), world.now)
                )
    assert {Verdict.RESIDENT, Verdict.FITS, Verdict.AFTER_EVICTION, Verdict.NO_ROOM} <= seen
