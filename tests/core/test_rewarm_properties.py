"""Warm again over random event sequences (hypothesis): the core world of
test_core_properties, with every eviction noted in the rewarm book as the gate does, and
rewarms started whenever the book says one is due. After every step:

* no rewarm ticket waits on the card while a real demand waits there;
* a rewarm's evictions are of idle residents its class may take (lower, or equal);
* every lease and ticket, rewarms' too, belongs to someone still holding or waiting on it,
  and at the end nothing is left.
"""

from __future__ import annotations

import hypothesis.strategies as st
from hypothesis import HealthCheck, given, settings
from hypothesis.stateful import invariant, precondition, rule

from gpugate.core.classes import PriorityClass as P
from gpugate.core.classes import ResidencyPolicy
from gpugate.core.effects import Grant, Preempt, Reject, Unload, UnloadReason
from gpugate.core.residents import ResidentKey, ResidentState
from gpugate.core.rewarm import Evicted, RewarmOutcome
from gpugate.core.rewarm_plan import due, start
from gpugate.core.units import GiB
from gpugate.core.views import PlannerSettings
from tests.core.builders import demand
from tests.core.test_core_properties import CoreWorld
from tests.core.test_rewarm import Host, of

REWARM_MODELS = (
    ("bg", 6 * GiB, P.BACKGROUND),
    ("keep", 4 * GiB, P.INTERACTIVE),
    ("big", 9 * GiB, P.PRODUCTION),
    ("low", 3 * GiB, P.MAINTENANCE),
)
"""Models that cannot all be resident on the 16 GiB card, of classes that evict each other."""


class RewarmWorld(CoreWorld):
    # Higher-class idle models yield to waiting lower-class requests: never to a rewarm.
    planner = PlannerSettings(equal_class_grace=5.0, yield_after=3.0)

    def __init__(self) -> None:
        self._checking = True
        self.rewarming: set[int] = set()
        """Rewarm tickets and leases the world (as the gate) holds."""
        super().__init__()
        self.core.rewarms.wants = lambda key, policy: True
        self._checking = False

    def _apply(self, effects) -> None:
        effects = list(effects)
        book = self.core.rewarms
        for effect in effects:
            if isinstance(effect, Unload) and book.is_rewarm(effect.for_ticket or -1):
                ticket = self.core.scheduler.tickets[effect.for_ticket]
                victim = self.core.resident(effect.key)
                assert victim is not None
                assert victim.in_flight == 0, f"a rewarm evicted {victim.key}, in use"
                assert victim.priority <= ticket.demand.priority, (
                    f"a rewarm of class {ticket.demand.priority.label} evicted "
                    f"{victim.key} of class {victim.priority.label}"
                )
            if isinstance(effect, Reject) and effect.ticket_id in self.rewarming:
                # The gate's waiter is told; the book says how it ended.
                self.rewarming.discard(effect.ticket_id)
                self.waiting.pop(effect.ticket_id, None)
                book.finished(self.core, effect.ticket_id, RewarmOutcome.FAILED, self.now)
                continue
        book.note(self.core, effects, self.now)
        super()._apply([e for e in effects if not self._rewarm_reject(e)])
        if not self._checking:
            # As the gate does after each event it carries out: start what is due.
            self._checking = True
            try:
                self.rewarms_due()
            finally:
                self._checking = False

    def _rewarm_reject(self, effect) -> bool:
        return isinstance(effect, Reject) and effect.ticket_id not in self.waiting

    @rule(
        model=st.sampled_from(REWARM_MODELS),
        klass=st.sampled_from(list(P)),
        ttl=st.sampled_from([0.0, 300.0]),
    )
    def request(self, model, klass, ttl):
        # The base world's request, its model unloaded at once when its request ends (a
        # render's memory given back) or kept long enough to outlast an eviction.
        name, envelope, resident_class = model
        d = demand(name, envelope, priority=klass, resident_priority=resident_class, ttl=ttl)
        admission = self.core.submit(d, self.now)
        if admission.waiting:
            self.waiting[admission.ticket_id] = admission
        self._apply(admission.effects)
        if admission.lease is not None:
            self.in_flight[admission.lease.id] = admission.lease

    @rule()
    def rewarms_due(self):
        for rewarm in due(self.core, self.now):
            admission = start(self.core, rewarm, self.now)
            if admission.failure is not None:
                self._apply(admission.effects)
                continue
            self.rewarming.add(admission.ticket_id)
            if admission.waiting:
                self.waiting[admission.ticket_id] = admission
            self._apply(admission.effects)
            if admission.lease is not None:
                self.in_flight[admission.lease.id] = admission.lease

    @precondition(
        lambda self: any(
            lease_id in self.rewarming and self.core.lease(lease_id) is not None
            for lease_id in self.in_flight
        )
    )
    @rule()
    def rewarm_loads_and_ends(self):
        # As the gate does: the runtime answers its load request, the lease ends at once.
        lease_id = min(x for x in self.in_flight if x in self.rewarming)
        lease = self.core.lease(lease_id)
        assert lease is not None
        if lease.pending:
            self.materialised[lease.key] = lease.pending
            self._apply(self.core.loaded(lease_id, self.now))
        del self.in_flight[lease_id]
        self.rewarming.discard(lease_id)
        self._apply(self.core.release(lease_id, self.now))
        self.core.rewarms.finished(self.core, lease_id, RewarmOutcome.DONE, self.now)

    @invariant()
    def no_rewarm_waits_beside_a_real_demand(self):
        waiting = self.core.waiting(0)
        real = [t for t in waiting if not self.core.rewarms.is_rewarm(t.id)]
        rewarms = [t for t in waiting if self.core.rewarms.is_rewarm(t.id)]
        assert not (real and rewarms), "a rewarm waits in front of or beside a real demand"

    @invariant()
    def the_book_knows_only_live_rewarms(self):
        for ticket_id in self.core.rewarms.under_way:
            assert ticket_id in self.rewarming

    def teardown(self):
        super().teardown()
        for ticket_id in sorted(self.rewarming):
            self.core.rewarms.finished(self.core, ticket_id, RewarmOutcome.CANCELLED, self.now)
        assert self.core.rewarms.under_way == {}


TestRewarmWorld = RewarmWorld.TestCase
TestRewarmWorld.settings = settings(
    max_examples=150,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


# -- one rewarm against a random card, then a real demand --------------------------------

HOLDER = st.tuples(
    st.integers(min_value=1, max_value=5),  # GiB
    st.sampled_from(list(P)),
    st.booleans(),  # in use
)


@given(
    holders=st.lists(HOLDER, min_size=0, max_size=4),
    rewarm_class=st.sampled_from([P.BACKGROUND, P.INTERACTIVE, P.MAINTENANCE]),
    size=st.integers(min_value=1, max_value=8),
    real=st.tuples(st.integers(min_value=1, max_value=9), st.sampled_from(list(P))),
)
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_a_rewarm_takes_only_idle_memory_its_class_may_and_gives_way(
    holders, rewarm_class, size, real
):
    world = Host(yield_after=15.0)  # idle 40 s by the rewarm: higher classes would yield
    core = world.core
    # The model to warm again was evicted for a higher class: remembered as the book does.
    key = ResidentKey("ollama", "warm")
    core.rewarms.evicted[key] = Evicted(
        key,
        0,
        size * GiB,
        rewarm_class,
        ResidencyPolicy.KEEP_WARM,
        900.0,
        1.0,
        0.0,
        900.0,
        P.PRODUCTION,
    )
    busy_leases = []
    for i, (gib, klass, busy) in enumerate(holders):
        d = demand(f"m{i}", gib * GiB, priority=klass)
        admission = core.submit(d, world.now)
        world.apply(admission.effects)
        if admission.lease is None:
            continue  # it did not fit beside the others: not a holder
        world.apply(core.loaded(admission.lease.id, world.now))
        world.held[d.model] = d.envelope
        if busy:
            busy_leases.append(admission.lease)
        else:
            world.apply(core.release(admission.lease.id, world.now))
    world.at(40.0)  # past the equal-class grace
    rewarm = None
    for chosen in due(core, world.now):
        rewarm = start(core, chosen, world.now)
        effects = world.apply(rewarm.effects)
        assert rewarm.failure is None
        for unload in of(effects, Unload):
            victim = core.resident(unload.key)
            assert victim is not None and victim.in_flight == 0
            assert victim.priority <= rewarm_class
            assert unload.for_ticket == rewarm.ticket_id
        assert not of(effects, Preempt)
    # A real demand comes.
    gib, klass = real
    admission = core.submit(demand("real", gib * GiB, priority=klass), world.now)
    effects = world.apply(admission.effects)
    if rewarm is not None and rewarm.waiting:
        # It gave way: its waiter told, nothing of it in the queue.
        assert [r.ticket_id for r in of(effects, Reject)][:1] == [rewarm.ticket_id]
        assert core.rewarms.under_way == {}
    assert not any(core.rewarms.is_rewarm(t.id) for t in core.waiting())
    # Everything runs to its end, as the gate would carry it out: nothing is left.
    live = {x.id for x in busy_leases}
    if rewarm is not None and rewarm.lease is not None:
        live.add(rewarm.lease.id)
    if admission.lease is not None:
        live.add(admission.lease.id)
    for _ in range(20):
        unloads = [r for r in core.residents() if r.state is ResidentState.UNLOADING]
        for resident in unloads:
            for effect in world.unload(Unload(resident.key, 0, resident.bytes, UnloadReason.TTL)):
                if isinstance(effect, Grant):
                    live.add(effect.lease.id)
        # A grant can come from any effect (a sample's too): every lease the core holds.
        for lease_id in sorted(live | {lease.id for lease in core.leases()}):
            if core.lease(lease_id) is not None:
                world.apply(core.loaded(lease_id, world.now))
                world.apply(core.release(lease_id, world.now))
                core.rewarms.finished(core, lease_id, RewarmOutcome.DONE, world.now)
        live = {x for x in live if core.lease(x) is not None}
        if not core.waiting() and not live:
            break
        for ticket in core.waiting():
            world.apply(core.cancel(ticket.id, world.now))
            core.rewarms.finished(core, ticket.id, RewarmOutcome.CANCELLED, world.now)
    assert core.leases() == [] and core.waiting() == []
    assert core.rewarms.under_way == {}
