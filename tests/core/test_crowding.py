"""A runtime that holds at most so many models (llama-server's --models-max): the gate makes
room itself, by its own order and class rules, before a load would make the runtime unload
one of its own choosing; what the runtime still counts (loading, unloading) keeps the load
back until it is gone."""

from __future__ import annotations

import attrs
import pytest

from gpugate.core.classes import PriorityClass, ResidencyPolicy
from gpugate.core.effects import Grant, Unload, UnloadReason
from gpugate.core.failures import FailureClass
from gpugate.core.planner import PlanKind, PlannerSettings, plan
from gpugate.core.residents import Resident, ResidentKey, ResidentState
from gpugate.core.units import GiB
from tests.core.builders import demand, gpu, host, make_core, proc

P = PriorityClass


def limited(model: str, most: int | None = 2, **kw):
    return attrs.evolve(demand(model, 1 * GiB, consumer="llama", **kw), most_models=most)


def held(
    model: str,
    *,
    last_used: float = 0.0,
    in_flight: int = 0,
    priority: PriorityClass = P.INTERACTIVE,
    policy: ResidencyPolicy = ResidencyPolicy.KEEP_WARM,
    ttl: float | None = 900.0,
    state: ResidentState = ResidentState.RESIDENT,
    gpu_index: int = 0,
) -> Resident:
    return Resident(
        ResidentKey("llama", model),
        gpu_index,
        1 * GiB,
        priority,
        policy,
        ttl,
        state=state,
        in_flight=in_flight,
        last_used=last_used,
    )


def decide(d, residents, *, now=100.0, deadline=160.0, claimed=frozenset()):
    """Plan with plenty of memory: only the runtime's limit can hold the demand back."""
    mine = [r for r in residents if r.key.consumer == d.consumer and r.key.model != d.model]
    return plan(
        d,
        pool=10 * GiB,
        residents=residents,
        now=now,
        deadline=deadline,
        settings=PlannerSettings(equal_class_grace=30.0),
        claimed=claimed,
        held=mine if d.most_models is not None else (),
    )


def test_below_the_limit_or_without_one_a_load_just_fits():
    assert decide(limited("c"), [held("a")]).kind is PlanKind.GRANT
    assert decide(limited("c", None), [held("a"), held("b")]).kind is PlanKind.GRANT


def test_at_the_limit_the_gate_evicts_by_its_own_order_at_once():
    # Same class, idle for only a second: no equal-class grace, the runtime would not wait.
    result = decide(limited("c"), [held("a", last_used=99.0), held("b", last_used=50.0)])
    assert result.kind is PlanKind.EVICT
    assert result.victims == (ResidentKey("llama", "b"),)


def test_a_model_held_already_needs_no_room():
    result = decide(limited("a"), [held("a"), held("b")])
    assert (result.kind, result.needed) == (PlanKind.GRANT, 0)


def test_a_busy_model_is_passed_over_and_with_none_idle_the_load_waits():
    result = decide(limited("c"), [held("a", in_flight=1), held("b", last_used=99.0)])
    assert result.victims == (ResidentKey("llama", "b"),)
    waiting = decide(limited("c"), [held("a", in_flight=1), held("b", in_flight=2)])
    assert (waiting.kind, waiting.earliest) == (PlanKind.WAIT, 100.0)
    assert set(waiting.counting_on) == {ResidentKey("llama", "a"), ResidentKey("llama", "b")}


@pytest.mark.parametrize("state", [ResidentState.LOADING, ResidentState.UNLOADING])
def test_what_is_loading_or_still_unloading_counts_as_held(state):
    # The router counts a loading child and a stopping one until it exited.
    result = decide(limited("c"), [held("a", last_used=1.0), held("b", state=state)])
    if state is ResidentState.LOADING:
        assert (result.kind, result.victims) == (PlanKind.EVICT, (ResidentKey("llama", "a"),))
    else:
        assert result.kind is PlanKind.WAIT
        assert result.counting_on == (ResidentKey("llama", "b"),)


def test_the_class_rules_hold_the_runtime_would_not_keep():
    guarded = held("a", policy=ResidencyPolicy.ALWAYS_WARM, ttl=None)
    higher = held("b", priority=P.PRODUCTION, ttl=None)
    result = decide(limited("c", priority=P.BACKGROUND), [guarded, higher])
    assert (result.kind, result.failure) == (PlanKind.FAIL, FailureClass.EVICTION_NOT_ALLOWED)
    # With an idle ttl the production model goes by itself: wait if that is in time.
    expiring = held("b", priority=P.PRODUCTION, ttl=30.0, last_used=90.0)
    result = decide(limited("c", priority=P.BACKGROUND), [guarded, expiring])
    assert (result.kind, result.earliest) == (PlanKind.WAIT, 120.0)
    late = decide(limited("c", priority=P.BACKGROUND), [guarded, expiring], deadline=110.0)
    assert late.failure is FailureClass.DEADLINE_CANNOT_BE_MET


def test_a_model_an_earlier_ticket_counts_on_is_not_taken():
    result = decide(
        limited("c"),
        [held("a", last_used=1.0), held("b", last_used=2.0)],
        claimed={ResidentKey("llama", "a")},
    )
    assert result.victims == (ResidentKey("llama", "b"),)


def test_another_consumers_models_do_not_count():
    other = Resident(
        ResidentKey("ollama", "x"), 0, GiB, P.BACKGROUND, ResidencyPolicy.KEEP_WARM, 1.0
    )
    assert decide(limited("c"), [held("a"), other]).kind is PlanKind.GRANT


def test_through_the_core_the_load_waits_for_its_victims_unload_to_end():
    core = make_core(consumers=("llama",), reconcilable=("llama",))
    core.observe(host(gpu(), at=0.0), 0.0)
    for now, model in ((1.0, "a"), (2.0, "b")):
        lease = core.submit(limited(model), now).lease
        assert lease is not None
        core.loaded(lease.id, now)
        core.release(lease.id, now)
    core.observe(host(gpu(proc(11, 2 * GiB, "llama")), at=3.0), 3.0)
    admission = core.submit(limited("c"), 4.0)
    assert admission.waiting
    unloads = [e for e in admission.effects if isinstance(e, Unload)]
    assert [(u.key.model, u.reason) for u in unloads] == [("a", UnloadReason.EVICTION)]
    # Its memory back is not enough: the runtime still counts it until it is gone.
    core.observe(host(gpu(proc(12, 1 * GiB, "llama")), at=5.0), 5.0)
    assert not any(isinstance(e, Grant) for e in core.tick(5.0))
    grants = [e for e in core.unloaded(unloads[0].key, 6.0, reclaimed=True) if isinstance(e, Grant)]
    assert [g.ticket_id for g in grants] == [admission.ticket_id]
    assert sorted(r.key.model for r in core.residents()) == ["b", "c"]
