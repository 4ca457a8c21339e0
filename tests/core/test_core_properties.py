"""Property tests of the decision core over random event sequences (hypothesis).

A small simulated world (one 16 GiB GPU, five models, an external user that grows and
shrinks) is driven through random requests, loads, releases, cancellations, samples,
listings, unloads and time. After every step:

* a step that granted bytes never left committed + external + reserve above total;
* every lease belongs to a request still in flight, every waiting ticket to a client
  still waiting (and at the end nothing is left);
* no ticket of a higher class that fits waits while a lower class was granted bytes.
"""

from __future__ import annotations

import hypothesis.strategies as st
from hypothesis import HealthCheck, settings
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from gpugate.core.classes import PriorityClass
from gpugate.core.effects import Grant, Reject, Unload
from gpugate.core.residents import ResidentKey
from gpugate.core.state import ListedModel
from gpugate.core.units import GiB
from gpugate.core.views import PlannerSettings
from tests.core.builders import (
    RESERVED,
    TOTAL,
    WORLD_MODELS,
    assert_sums_recounted,
    demand,
    make_core,
    proc,
    world_sample,
)

P = PriorityClass


class CoreWorld(RuleBasedStateMachine):
    planner: PlannerSettings | None = None
    """The queue's settings; None: make_core's, with an equal-class grace of 5 s."""

    def __init__(self) -> None:
        super().__init__()
        planner = self.planner or PlannerSettings(equal_class_grace=5.0)
        self.core = make_core(max_wait=30.0, queue_limit=3, planner=planner)
        self.now = 0.0
        self.external = 0
        self.materialised: dict[ResidentKey, int] = {}
        self.in_flight: dict[int, object] = {}
        self.waiting: dict[int, object] = {}
        self.unloads: dict[ResidentKey, Unload] = {}
        self._sample()

    # -- the world -------------------------------------------------------------------

    def _sample(self) -> None:
        runners = [proc(10 + i, b, "ollama") for i, b in enumerate(self.materialised.values())]
        observation = world_sample(self.core, runners, self.external, self.now)
        self._apply(self.core.observe(observation, self.now))

    def _apply(self, effects) -> None:
        granted = []
        for effect in effects:
            if isinstance(effect, Grant):
                assert effect.ticket_id in self.waiting, "granted a ticket nobody waits on"
                del self.waiting[effect.ticket_id]
                self.in_flight[effect.lease.id] = effect.lease
                granted.append(effect.lease)
            elif isinstance(effect, Reject):
                assert effect.ticket_id in self.waiting, "rejected a ticket nobody waits on"
                del self.waiting[effect.ticket_id]
            elif isinstance(effect, Unload):
                self.unloads[effect.key] = effect
        self._check_step(granted)

    def _check_step(self, granted) -> None:
        budget = self.core.budget(0)
        positive = [lease for lease in granted if lease.pending > 0]
        if positive:
            assert (
                budget.committed_total + budget.external_total + budget.reserve + RESERVED <= TOTAL
            )
        waiting = self.core.waiting(0)
        seen: set[ResidentKey] = set()
        for ticket in waiting:
            key = ticket.demand.key
            riding = key in seen or any(r.key.model == key.model for r in self.core.residents(0))
            seen.add(key)
            if riding:
                continue
            lower_bytes = sum(
                lease.pending
                for lease in positive
                if lease.demand.priority < ticket.demand.priority
            )
            if lower_bytes:
                assert ticket.demand.envelope > budget.schedulable + lower_bytes, (
                    f"{ticket.demand.key} ({ticket.demand.priority.label}) waits although it "
                    "fits in what lower classes were just given"
                )

    # -- rules -----------------------------------------------------------------------

    @rule(model=st.sampled_from(WORLD_MODELS), klass=st.sampled_from(list(P)))
    def request(self, model, klass):
        self._request(model, klass, ttl=20.0)

    def _request(self, model, klass, *, ttl: float) -> None:
        """A client asks for `model` (name, bytes, its class once loaded) as `klass`: it
        waits, or holds its lease, and a grant that starts a load is checked."""
        name, envelope, resident_class = model
        admission = self.core.submit(
            demand(name, envelope, priority=klass, resident_priority=resident_class, ttl=ttl),
            self.now,
        )
        if admission.waiting:
            self.waiting[admission.ticket_id] = admission
        self._apply(admission.effects)
        if admission.lease is not None:
            self.in_flight[admission.lease.id] = admission.lease
            if admission.lease.pending:
                self._check_step([admission.lease])

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
        del self.in_flight[lease_id]
        self._apply(self.core.release(lease_id, self.now, failed=failed))

    @precondition(lambda self: self.waiting)
    @rule(data=st.data())
    def client_gives_up(self, data):
        ticket_id = data.draw(st.sampled_from(sorted(self.waiting)))
        del self.waiting[ticket_id]
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

    @rule(seconds=st.floats(min_value=0.1, max_value=12.0))
    def time_passes(self, seconds):
        self.now += seconds
        self._sample()
        self._apply(self.core.tick(self.now))

    @rule()
    def runtime_lists_its_models(self):
        listed = [
            ListedModel(key.model, nbytes, nbytes, P.BACKGROUND, r.policy, r.idle_ttl)
            for key, nbytes in self.materialised.items()
            if (r := self.core.resident(key)) is not None
        ]
        self._apply(self.core.reconcile("ollama", 0, listed, asked_at=self.now, now=self.now))

    # -- invariants --------------------------------------------------------------------

    @invariant()
    def carried_sums_are_a_recount(self):
        assert_sums_recounted(self.core)

    @invariant()
    def leases_belong_to_live_requests(self):
        assert {x.id for x in self.core.leases()} == set(self.in_flight)

    @invariant()
    def tickets_belong_to_waiting_clients(self):
        assert {t.id for t in self.core.waiting()} == set(self.waiting)

    def teardown(self):
        # Every client goes away; a grant that reaches a client already gone is released,
        # as the gate does.
        while self.waiting:
            ticket_id = min(self.waiting)
            del self.waiting[ticket_id]
            self._apply(self.core.cancel(ticket_id, self.now))
        while self.in_flight:
            lease_id = min(self.in_flight)
            del self.in_flight[lease_id]
            self._apply(self.core.release(lease_id, self.now))
        assert self.core.leases() == []
        assert self.core.waiting() == []


TestCoreWorld = CoreWorld.TestCase
TestCoreWorld.settings = settings(
    max_examples=150,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
