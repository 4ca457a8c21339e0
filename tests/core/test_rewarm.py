"""Warm again (`gpugate.core.rewarm`): a kept-warm model evicted for a higher class is
loaded again once its memory returns, by a demand that never stands in front of a real
one, evicts only idle residents its class may take, and leaves no lease behind."""

from __future__ import annotations

import pytest

from gpugate.core.classes import PriorityClass, ResidencyPolicy
from gpugate.core.effects import Event, EventKind, Grant, Reject, Unload, UnloadReason
from gpugate.core.failures import FailureClass
from gpugate.core.rewarm import RewarmOutcome
from gpugate.core.rewarm_plan import due, start
from gpugate.core.units import GiB
from gpugate.core.views import PlannerSettings
from tests.core.builders import demand, gpu, host, make_core, proc

P = PriorityClass


def of(effects, kind):
    return [e for e in effects if isinstance(e, kind)]


def kinds(effects):
    return [e.kind for e in effects if isinstance(e, Event)]


class Host:
    """A core on one 16 GiB card (about 14.5 GiB schedulable) that notes every effect in
    its rewarm book, as the gate does when it carries them out."""

    def __init__(self, *, wants=lambda key, policy: True, yield_after=None) -> None:
        self.core = make_core(
            planner=PlannerSettings(equal_class_grace=5.0, yield_after=yield_after)
        )
        self.core.rewarms.wants = wants
        self.held: dict[str, int] = {}
        self.at(0.0)

    def at(self, now: float):
        """Time passes to `now`, and a fresh sample comes (samples older than 5 s are stale)."""
        self.now = now
        return self.sample()

    def apply(self, effects):
        effects = list(effects)
        self.core.rewarms.note(self.core, effects, self.now)
        return effects

    def sample(self):
        processes = [proc(10 + i, n, "ollama") for i, n in enumerate(self.held.values())]
        return self.apply(self.core.observe(host(gpu(*processes), at=self.now), self.now))

    def load(self, d):
        """Submit and, when granted, load and end the request: the model stays idle."""
        admission = self.core.submit(d, self.now)
        self.apply(admission.effects)
        assert admission.lease is not None, admission
        self.apply(self.core.loaded(admission.lease.id, self.now))
        self.held[d.model] = d.envelope
        return admission.lease

    def unload(self, unload: Unload):
        self.held.pop(unload.key.model, None)
        self.sample()
        return self.apply(self.core.unloaded(unload.key, self.now, reclaimed=True))

    def evict_for_flux(self, flux_policy=ResidencyPolicy.LOAD_ON_DEMAND):
        """An interactive 9 GiB load evicts the idle background bge-m3 (6 GiB); its request
        ends and, load-on-demand, it is unloaded at once: the memory is back."""
        bge = demand("bge-m3", 6 * GiB, priority=P.BACKGROUND, ttl=900.0)
        self.core.release(self.load(bge).id, self.now)
        self.at(10.0)
        flux = demand("flux", 9 * GiB, policy=flux_policy, ttl=0.0)
        admission = self.core.submit(flux, self.now)
        effects = self.apply(admission.effects)
        (evicted,) = of(effects, Unload)
        assert evicted.key == bge.key and evicted.reason is UnloadReason.EVICTION
        grants = of(self.unload(evicted), Grant)
        assert [g.ticket_id for g in grants] == [admission.ticket_id]
        lease = grants[0].lease
        self.apply(self.core.loaded(lease.id, self.now))
        self.held["flux"] = flux.envelope
        return bge, lease


def test_a_model_evicted_for_a_higher_class_comes_back_idle_until_its_old_expiry():
    world = Host()
    bge, flux = world.evict_for_flux()
    assert list(world.core.rewarms.evicted) == [bge.key]
    assert world.core.rewarms.evicted[bge.key].until == pytest.approx(900.0)
    # While the render holds the card it cannot come back.
    assert due(world.core, world.now) == []
    world.at(20.0)
    (unload,) = of(world.apply(world.core.release(flux.id, world.now)), Unload)
    world.unload(unload)
    (rewarm,) = due(world.core, world.now)
    assert rewarm.key == bge.key and rewarm.priority is P.BACKGROUND
    admission = start(world.core, rewarm, world.now)
    assert admission.lease is not None and admission.lease.pending == 6 * GiB
    assert EventKind.REWARM_STARTED in kinds(admission.effects)
    world.apply(world.core.loaded(admission.lease.id, world.now))
    world.apply(world.core.release(admission.lease.id, world.now))
    done = world.core.rewarms.finished(world.core, admission.ticket_id, RewarmOutcome.DONE, 20.0)
    assert kinds(done) == [EventKind.REWARM_DONE]
    resident = world.core.resident(bge.key)
    assert resident is not None and resident.idle
    # Its time-to-live ends when it would have, had it never been evicted.
    assert resident.expires_at() == pytest.approx(900.0)
    assert world.core.rewarms.evicted == {} and world.core.rewarms.under_way == {}
    assert world.core.leases() == [] and world.core.waiting() == []


def test_nothing_comes_back_once_its_time_to_live_has_passed():
    world = Host()
    _, flux = world.evict_for_flux()
    world.at(901.0)
    (unload,) = of(world.apply(world.core.release(flux.id, world.now)), Unload)
    world.unload(unload)
    assert due(world.core, world.now) == []
    assert world.core.rewarms.evicted == {}


def test_an_operator_eviction_and_an_equal_class_eviction_are_not_remembered():
    world = Host()
    a = demand("a", 6 * GiB, priority=P.INTERACTIVE)
    world.core.release(world.load(a).id, world.now)
    world.at(50.0)
    # Equal class (after its idle grace): not evicted "for a higher class".
    b = demand("b", 9 * GiB, priority=P.INTERACTIVE)
    effects = world.apply(world.core.submit(b, world.now).effects)
    assert [u.key for u in of(effects, Unload)] == [a.key]
    assert world.core.rewarms.evicted == {}

    world = Host()
    bge, _flux = world.evict_for_flux()
    world.apply([Unload(bge.key, 0, 6 * GiB, UnloadReason.OPERATOR)])
    assert world.core.rewarms.evicted == {}


def test_only_what_the_setting_wants_is_remembered():
    world = Host(wants=lambda key, policy: policy is ResidencyPolicy.ALWAYS_WARM)
    world.evict_for_flux()
    assert world.core.rewarms.evicted == {}


def _rewarm_that_must_evict(world: Host):
    """bge-m3 evicted for flux; flux gone, an idle maintenance model holds 6 GiB: the rewarm
    (background) must evict it, and waits for that unload."""
    bge, flux = world.evict_for_flux()
    world.at(20.0)
    (unload,) = of(world.apply(world.core.release(flux.id, world.now)), Unload)
    world.unload(unload)
    low = demand("low", 9 * GiB, priority=P.MAINTENANCE)
    world.core.release(world.load(low).id, world.now)
    world.sample()
    (rewarm,) = due(world.core, world.now)
    admission = start(world.core, rewarm, world.now)
    effects = world.apply(admission.effects)
    assert admission.waiting
    (evicting,) = of(effects, Unload)
    assert evicting.key == low.key and evicting.for_ticket == admission.ticket_id
    return bge, low, admission, evicting


def test_a_rewarm_evicts_an_idle_lower_class_resident_and_never_a_busy_or_higher_one():
    world = Host()
    _bge, flux = world.evict_for_flux()
    world.at(20.0)
    (unload,) = of(world.apply(world.core.release(flux.id, world.now)), Unload)
    world.unload(unload)
    # An interactive model, idle, and a maintenance one in use: neither may be taken.
    high = demand("high", 4 * GiB, priority=P.INTERACTIVE)
    world.core.release(world.load(high).id, world.now)
    busy = demand("busy", 5 * GiB, priority=P.MAINTENANCE)
    busy_lease = world.load(busy)
    world.sample()
    assert due(world.core, world.now) == []
    world.apply(world.core.release(busy_lease.id, world.now))
    (rewarm,) = due(world.core, world.now)
    admission = start(world.core, rewarm, world.now)
    effects = world.apply(admission.effects)
    assert [u.key for u in of(effects, Unload)] == [busy.key]


def test_no_higher_class_model_yields_to_a_rewarm_however_long_it_has_been_idle():
    # yield_after makes an idle interactive model give way to a waiting background request;
    # nobody waits for a rewarm, and swapping the interactive model out for it is churn.
    world = Host(yield_after=15.0)
    bge, flux = world.evict_for_flux()
    world.at(20.0)
    (unload,) = of(world.apply(world.core.release(flux.id, world.now)), Unload)
    world.unload(unload)
    high = demand("high", 9 * GiB, priority=P.INTERACTIVE)
    world.core.release(world.load(high).id, world.now)
    world.at(100.0)  # idle 80 s, past yield_after: a real background request would take it
    assert due(world.core, world.now) == []
    assert [r.key for r in world.core.residents()] == [high.key]
    real = world.core.submit(demand("bge-m3", 6 * GiB, priority=P.BACKGROUND), world.now)
    assert [u.key for u in of(world.apply(real.effects), Unload)] == [high.key]
    assert list(world.core.rewarms.evicted) == [bge.key]


def test_a_real_demand_cancels_a_waiting_rewarm_and_is_planned_as_if_it_never_was():
    world = Host()
    _bge, _low, rewarm, evicting = _rewarm_that_must_evict(world)
    world.at(21.0)
    real = demand("qwen", 9 * GiB, priority=P.BACKGROUND)
    admission = world.core.submit(real, world.now)
    effects = world.apply(admission.effects)
    rejects = of(effects, Reject)
    assert [r.ticket_id for r in rejects] == [rewarm.ticket_id]
    assert rejects[0].failure.failure_class is FailureClass.RESIDENCY_CONFLICT
    assert EventKind.REWARM_CANCELLED in kinds(effects)
    # The real demand waits for the memory the rewarm's eviction frees, alone in the queue.
    assert [t.id for t in world.core.waiting()] == [admission.ticket_id]
    assert world.core.rewarms.under_way == {}
    grants = of(world.unload(evicting), Grant)
    assert [g.ticket_id for g in grants] == [admission.ticket_id]
    # No rewarm is started while the real one holds a load under way... nor after, for
    # there is no room for bge-m3 beside it: nothing waits, nothing is leased for it.
    assert due(world.core, world.now) == []
    world.apply(world.core.release(grants[0].lease.id, world.now))
    assert [x.id for x in world.core.leases()] == []
    assert world.core.waiting() == []


def test_any_real_demand_to_plan_on_the_card_goes_first_even_one_that_fits():
    world = Host()
    _, _low, rewarm, _ = _rewarm_that_must_evict(world)
    assert world.core.rewarms.is_rewarm(rewarm.ticket_id)
    world.at(21.0)
    other = demand("other", GiB, priority=P.INTERACTIVE)
    admission = world.core.submit(other, world.now)
    effects = world.apply(admission.effects)
    assert [r.ticket_id for r in of(effects, Reject)] == [rewarm.ticket_id]
    assert admission.lease is not None
    assert world.core.waiting() == []


def test_no_rewarm_starts_while_a_real_demand_waits_on_its_card():
    world = Host()
    bge, flux = world.evict_for_flux()
    world.at(20.0)
    # A real demand waits (for the flux render's memory) on the card.
    waiting = world.core.submit(demand("big", 6 * GiB, priority=P.PRODUCTION), world.now)
    world.apply(waiting.effects)
    assert waiting.waiting
    (unload,) = of(world.apply(world.core.release(flux.id, world.now)), Unload)
    effects = world.unload(unload)
    assert [g.ticket_id for g in of(effects, Grant)] == [waiting.ticket_id]
    # Now the card has room for bge-m3 beside it, and nothing waits: it comes back.
    (rewarm,) = due(world.core, world.now)
    assert rewarm.key == bge.key


def test_a_model_loaded_with_runner_options_is_not_warmed_again_without_them():
    world = Host()
    bge = demand("bge-m3", 6 * GiB, priority=P.BACKGROUND, options="num_ctx=8192")
    world.core.release(world.load(bge).id, world.now)
    world.at(10.0)
    flux = demand("flux", 9 * GiB, policy=ResidencyPolicy.LOAD_ON_DEMAND, ttl=0.0)
    effects = world.apply(world.core.submit(flux, world.now).effects)
    assert [u.key for u in of(effects, Unload)] == [bge.key]
    assert world.core.rewarms.evicted == {}
