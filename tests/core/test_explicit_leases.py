"""Explicit leases in the core: granted, queued, evicting, renewed, released, lapsed."""

from __future__ import annotations

import hypothesis.strategies as st
import pytest
from hypothesis import HealthCheck, settings
from hypothesis.stateful import invariant, precondition, rule

from gpugate.core.classes import PriorityClass
from gpugate.core.effects import Event, EventKind, Grant, Unload, UnloadReason
from gpugate.core.explicit import LeaseTerms, identity_owner
from gpugate.core.failures import FailureClass
from gpugate.core.units import GiB
from tests.core.builders import demand, gpu, host, make_core
from tests.core.test_core_properties import CoreWorld

P = PriorityClass


def events(effects, kind: EventKind):
    return [e for e in effects if isinstance(e, Event) and e.kind is kind]


def terms(nbytes, *, owner="ollama", priority=P.INTERACTIVE, ttl=30.0, max_wait=None):
    return LeaseTerms(owner, 0, nbytes, priority, ttl, max_wait)


@pytest.fixture
def core():
    core = make_core(max_wait=60.0, queue_limit=2)
    core.observe(host(gpu(), at=0.0), now=0.0)
    return core


def test_granted_lease_commits_its_bytes_until_released(core):
    free = core.budget(0).schedulable
    admission = core.ask(terms(4 * GiB), 1.0)
    lease = admission.lease
    assert lease is not None and lease.pending == 4 * GiB
    assert lease.expires_at == 31.0
    assert lease.key.model == f"lease-{lease.id}"
    assert core.residents() == []
    assert core.budget(0).consumer("ollama").committed == 4 * GiB
    assert core.budget(0).schedulable == free - 4 * GiB
    # The gate never reports a load for it: the bytes stay pending.
    assert core.loaded(lease.id, 2.0) == []
    assert core.lease(lease.id).pending == 4 * GiB

    released = core.release(lease.id, 5.0)
    assert [e.reason for e in events(released, EventKind.LEASE_RELEASED)] == ["done"]
    assert core.leases() == [] and core.residents() == []
    assert core.budget(0).schedulable == free
    assert core.next_wakeup() is None


def test_an_identity_gets_its_own_budget_row(core):
    owner = identity_owner("trainer")
    lease = core.ask(terms(2 * GiB, owner=owner), 1.0).lease
    assert lease is not None
    assert core.budget(0).consumer(owner).pending == 2 * GiB
    assert core.budget(0).consumer("ollama").committed == 0


def test_observed_use_of_the_lease_is_counted_once(core):
    from tests.core.builders import proc

    lease = core.ask(terms(4 * GiB), 1.0).lease
    assert lease is not None
    core.observe(host(gpu(proc(10, 3 * GiB, "ollama")), at=2.0), 2.0)
    row = core.budget(0).consumer("ollama")
    assert row.committed == 4 * GiB and row.unexplained == 0


def test_renewal_moves_the_expiry_and_a_lapse_returns_the_bytes(core):
    free = core.budget(0).schedulable
    lease = core.ask(terms(4 * GiB, ttl=10.0), 0.0).lease
    assert core.next_wakeup() == 10.0
    assert core.renew(lease.id, 8.0) == []
    assert core.lease(lease.id).expires_at == 18.0
    assert core.next_wakeup() == 18.0
    assert core.tick(17.9) == []

    effects = core.tick(18.0)
    failures = events(effects, EventKind.FAILURE)
    assert [f.failure.failure_class for f in failures] == [FailureClass.LEASE_TIMEOUT]
    assert "not renewed within its ttl of 10s" in failures[0].failure.message
    assert [e.reason for e in events(effects, EventKind.LEASE_RELEASED)] == ["expired"]
    assert core.leases() == []
    assert core.budget(0).schedulable == free
    assert core.renew(lease.id, 18.5) == []
    assert core.lease(lease.id) is None


def test_renewing_after_the_expiry_lapses_instead(core):
    lease = core.ask(terms(1 * GiB, ttl=5.0), 0.0).lease
    effects = core.renew(lease.id, 5.0)
    assert [f.failure.failure_class for f in events(effects, EventKind.FAILURE)] == [
        FailureClass.LEASE_TIMEOUT
    ]
    assert core.lease(lease.id) is None


def test_renewing_a_request_lease_does_nothing(core):
    lease = core.submit(demand("m", 1 * GiB), 0.0).lease
    assert core.renew(lease.id, 1.0) == []
    assert core.lease(lease.id).expires_at is None


def test_a_lease_evicts_an_idle_lower_class_model_then_is_granted(core):
    d = demand("big", 10 * GiB, priority=P.BACKGROUND)
    model = core.submit(d, 0.0).lease
    core.loaded(model.id, 0.0)
    core.release(model.id, 1.0)

    admission = core.ask(terms(8 * GiB, priority=P.INTERACTIVE), 2.0)
    assert admission.waiting
    unloads = [e for e in admission.effects if isinstance(e, Unload)]
    assert [(u.key, u.reason) for u in unloads] == [(d.key, UnloadReason.EVICTION)]
    core.observe(host(gpu(), at=3.0), 3.0)
    granted = [e for e in core.unloaded(d.key, 3.0, reclaimed=True) if isinstance(e, Grant)]
    assert [g.ticket_id for g in granted] == [admission.ticket_id]
    assert granted[0].lease.id == admission.ticket_id
    assert granted[0].lease.expires_at == 33.0
    assert core.waiting() == []


def test_its_own_max_wait_is_its_deadline(core):
    core.submit(demand("busy", 12 * GiB, priority=P.BACKGROUND), 0.0)
    admission = core.ask(terms(4 * GiB, priority=P.BACKGROUND, max_wait=2.5), 1.0)
    assert admission.waiting
    assert [t.deadline for t in core.waiting()] == [3.5]


def test_a_waiting_lease_times_out_at_its_max_wait(core):
    first = core.submit(demand("busy", 12 * GiB, priority=P.BACKGROUND), 0.0).lease
    assert first is not None
    admission = core.ask(terms(4 * GiB, priority=P.BACKGROUND, max_wait=2.0), 0.0)
    assert admission.waiting
    assert core.next_wakeup() == 2.0
    effects = core.tick(2.0)
    rejected = [e for e in events(effects, EventKind.FAILURE)]
    assert [e.failure.failure_class for e in rejected] == [FailureClass.LEASE_TIMEOUT]
    assert core.waiting() == []
    assert [x.id for x in core.leases()] == [first.id]


# -- property: an explicit lease never outlives its expiry by more than one tick ----------


class ExplicitLeaseWorld(CoreWorld):
    """The core world, with batch jobs holding explicit leases among the requests.

    An explicit lease is in flight like a request's (its holder may release it), and may
    also lapse; every step that moves the clock ticks, as the gate's timer does.
    """

    def _apply(self, effects) -> None:
        super()._apply(effects)
        for event in effects:
            if isinstance(event, Event) and event.reason == "expired":
                lease_id = int(event.model.removeprefix("lease-"))
                assert self.in_flight.pop(lease_id, None) is not None, "lapsed twice"
                self.materialised.pop(event.key, None)

    @rule(
        nbytes=st.sampled_from([1 * GiB, 3 * GiB, 7 * GiB]),
        klass=st.sampled_from(list(P)),
        ttl=st.sampled_from([1.0, 5.0, 20.0]),
    )
    def job_asks(self, nbytes, klass, ttl):
        admission = self.core.ask(LeaseTerms("ollama", 0, nbytes, klass, ttl), self.now)
        if admission.waiting:
            self.waiting[admission.ticket_id] = admission
        self._apply(admission.effects)
        if admission.lease is not None:
            self.in_flight[admission.lease.id] = admission.lease
            self._check_step([admission.lease])

    @precondition(lambda self: any(x.expires_at is not None for x in self.core.leases()))
    @rule(data=st.data())
    def job_renews(self, data):
        held = sorted(x.id for x in self.core.leases() if x.expires_at is not None)
        lease_id = data.draw(st.sampled_from(held))
        before = self.core.lease(lease_id).expires_at
        self._apply(self.core.renew(lease_id, self.now))
        assert self.core.lease(lease_id).expires_at >= before

    @invariant()
    def explicit_leases_never_outlive_their_expiry(self):
        # Every step that moves the clock ticks once: a lease still held at `now` has
        # an expiry after it, and the core's next wakeup is no later than that expiry.
        expiries = [x.expires_at for x in self.core.leases() if x.expires_at is not None]
        for at in expiries:
            assert at > self.now, "an explicit lease outlived its expiry past a tick"
        if expiries:
            wake = self.core.next_wakeup()
            assert wake is not None and wake <= min(expiries)


TestExplicitLeaseWorld = ExplicitLeaseWorld.TestCase
TestExplicitLeaseWorld.settings = settings(
    max_examples=100,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


def test_a_renewal_keeps_a_ttl_within_the_longest_allowed_now(core):
    lease = core.ask(terms(1 * GiB, ttl=600.0), 0.0).lease
    assert core.renew(lease.id, 10.0, longest=900.0) == []
    assert core.lease(lease.id).expires_at == 610.0
    # The bound was lowered (a reload): from this renewal on the lease lives by it.
    assert core.renew(lease.id, 20.0, longest=60.0) == []
    assert core.lease(lease.id).expires_at == 80.0
    assert core.lease(lease.id).demand.lease_ttl == 60.0
    assert core.next_wakeup() == 80.0
    assert [e.reason for e in events(core.tick(80.0), EventKind.LEASE_RELEASED)] == ["expired"]
    assert core.leases() == []
