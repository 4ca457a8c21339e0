"""The planner alone: grant, evict these, wait, or fail — and whom it picks as victims."""

from __future__ import annotations

from gpugate.core.classes import PriorityClass, ResidencyPolicy
from gpugate.core.failures import FailureClass
from gpugate.core.planner import PlanKind, PlannerSettings, plan, victim_order
from gpugate.core.residents import ANY_OPTIONS, Resident, ResidentKey, ResidentState
from gpugate.core.units import GiB
from tests.core.builders import demand

P = PriorityClass


def resident(
    model: str,
    nbytes: int,
    priority: PriorityClass = P.BACKGROUND,
    *,
    in_flight: int = 0,
    last_used: float = 0.0,
    reload_seconds: float = 1.0,
    policy: ResidencyPolicy = ResidencyPolicy.KEEP_WARM,
    ttl: float | None = 900.0,
    options: str = "",
    state: ResidentState = ResidentState.RESIDENT,
) -> Resident:
    return Resident(
        ResidentKey("ollama", model, options),
        0,
        nbytes,
        priority,
        policy,
        ttl,
        state=state,
        in_flight=in_flight,
        last_used=last_used,
        reload_seconds=reload_seconds,
    )


def decide(d, pool, residents, now=100.0, deadline=160.0, grace=30.0, **kw):
    return plan(
        d,
        pool=pool,
        residents=residents,
        now=now,
        deadline=deadline,
        settings=PlannerSettings(equal_class_grace=grace),
        **kw,
    )


def test_fits_is_granted_for_its_whole_envelope():
    result = decide(demand("qwen", 4 * GiB), 5 * GiB, [])
    assert (result.kind, result.needed) == (PlanKind.GRANT, 4 * GiB)


def test_a_resident_model_costs_nothing_even_when_the_pool_is_negative():
    result = decide(demand("qwen", 4 * GiB), -1 * GiB, [resident("qwen", 4 * GiB)])
    assert (result.kind, result.needed) == (PlanKind.GRANT, 0)


def test_an_out_of_band_resident_serves_default_options_but_not_explicit_ones():
    loose = resident("qwen", 4 * GiB, options=ANY_OPTIONS)
    assert decide(demand("qwen", 4 * GiB), 0, [loose]).kind is PlanKind.GRANT
    explicit = decide(demand("qwen", 5 * GiB, options="num_ctx=8192"), 6 * GiB, [loose])
    # It replaces the loose copy, which must be unloaded first.
    assert explicit.kind is PlanKind.EVICT
    assert explicit.victims == (loose.key,)


def test_evicts_the_smallest_prefix_in_victim_order():
    residents = [
        resident("big-interactive", 6 * GiB, P.INTERACTIVE, last_used=1.0),
        resident("bg-old", 2 * GiB, P.BACKGROUND, last_used=1.0),
        resident("bg-new", 2 * GiB, P.BACKGROUND, last_used=50.0),
        resident("bench", 1 * GiB, P.BENCHMARK, last_used=90.0),
    ]
    result = decide(demand("gemma", 6 * GiB, priority=P.PRODUCTION), 2 * GiB, residents)
    assert result.kind is PlanKind.EVICT
    # Lowest class first (benchmark), then the least recently used background one.
    assert [k.model for k in result.victims] == ["bench", "bg-old", "bg-new"][: len(result.victims)]
    assert [k.model for k in result.victims] == ["bench", "bg-old", "bg-new"]


def test_cheaper_reload_per_byte_goes_before_lru():
    slow = resident("slow", 2 * GiB, last_used=1.0, reload_seconds=20.0)
    fast = resident("fast", 2 * GiB, last_used=50.0, reload_seconds=1.0)
    assert sorted([slow, fast], key=victim_order) == [fast, slow]
    result = decide(demand("gemma", 3 * GiB, priority=P.INTERACTIVE), 1 * GiB, [slow, fast])
    assert result.victims == (fast.key,)


def test_busy_and_higher_class_residents_are_never_victims():
    busy = resident("busy-bg", 8 * GiB, P.BACKGROUND, in_flight=1)
    higher = resident("prod", 8 * GiB, P.PRODUCTION)
    result = decide(demand("gemma", 6 * GiB, priority=P.INTERACTIVE), 1 * GiB, [busy, higher])
    assert result.kind is PlanKind.WAIT
    assert result.victims == ()
    assert busy.key in result.counting_on


def test_equal_class_only_after_the_idle_grace():
    recent = resident("peer", 6 * GiB, P.INTERACTIVE, last_used=90.0)
    d = demand("gemma", 6 * GiB, priority=P.INTERACTIVE)
    early = decide(d, 1 * GiB, [recent], now=100.0)
    assert early.kind is PlanKind.WAIT
    assert early.earliest == 120.0
    late = decide(d, 1 * GiB, [recent], now=121.0, deadline=200.0)
    assert late.kind is PlanKind.EVICT


def test_always_warm_yields_only_to_production():
    warm = resident(
        "whisper-ish", 6 * GiB, P.BACKGROUND, policy=ResidencyPolicy.ALWAYS_WARM, ttl=None
    )
    interactive = decide(demand("gemma", 6 * GiB, priority=P.INTERACTIVE), 1 * GiB, [warm])
    assert interactive.kind is PlanKind.FAIL
    assert interactive.failure is FailureClass.INSUFFICIENT_SCHEDULABLE_VRAM
    production = decide(demand("gemma", 6 * GiB, priority=P.PRODUCTION), 1 * GiB, [warm])
    assert production.kind is PlanKind.EVICT


def test_too_big_for_the_card_fails_at_once():
    result = decide(demand("llama-405b", 200 * GiB), 14 * GiB, [resident("x", 1 * GiB)])
    assert result.kind is PlanKind.FAIL
    assert result.failure is FailureClass.INSUFFICIENT_SCHEDULABLE_VRAM


def test_memory_that_frees_only_after_the_deadline_fails_with_deadline_class():
    pinned = resident("prod", 8 * GiB, P.PRODUCTION, last_used=100.0, ttl=900.0)
    result = decide(
        demand("gemma", 8 * GiB, priority=P.INTERACTIVE),
        1 * GiB,
        [pinned],
        now=100.0,
        deadline=220.0,
    )
    assert result.kind is PlanKind.FAIL
    assert result.failure is FailureClass.DEADLINE_CANNOT_BE_MET
    assert result.earliest == 1000.0


def test_a_loading_model_is_waited_for_not_loaded_twice():
    loading = resident("gemma", 0, state=ResidentState.LOADING, in_flight=1)
    result = decide(demand("gemma", 8 * GiB), 10 * GiB, [loading])
    assert result.kind is PlanKind.WAIT
    # It rides on the load under way: it will add nothing, so it keeps nothing back from
    # the tickets behind it (a lower class must not take what a higher one could use).
    assert (result.needed, result.counting_on) == (0, (loading.key,))


def test_a_model_being_unloaded_is_loaded_again_into_the_bytes_it_gives_back():
    unloading = resident("gemma", 8 * GiB, state=ResidentState.UNLOADING)
    result = decide(demand("gemma", 8 * GiB), 0, [unloading])
    assert result.kind is PlanKind.WAIT
    assert (result.needed, result.eventual) == (8 * GiB, 8 * GiB)


def test_claimed_residents_are_not_victims_but_still_worth_waiting_for():
    victim = resident("bg", 6 * GiB, P.BACKGROUND)
    result = decide(
        demand("gemma", 6 * GiB, priority=P.PRODUCTION), 1 * GiB, [victim], claimed={victim.key}
    )
    assert result.kind is PlanKind.WAIT
    assert result.victims == ()
    assert victim.key not in result.counting_on
    assert result.eventual == 0


def test_unexplained_memory_of_a_listing_runtime_is_worth_waiting_for():
    result = decide(demand("gemma", 6 * GiB), 1 * GiB, [], releasable_unexplained=6 * GiB)
    assert result.kind is PlanKind.WAIT


def test_unloads_under_way_are_counted_before_choosing_more_victims():
    going = resident("bg", 2 * GiB, P.BACKGROUND, state=ResidentState.UNLOADING)
    spare = resident("other", 8 * GiB, P.INTERACTIVE)
    result = decide(demand("qwen", 6 * GiB, priority=P.PRODUCTION), 5 * GiB, [going, spare])
    assert result.kind is PlanKind.WAIT
    assert result.counting_on == (going.key,)
    assert result.eventual == 2 * GiB


def test_while_its_unloads_run_a_demand_chooses_no_more_victims():
    going = resident("bg", 2 * GiB, P.BACKGROUND, state=ResidentState.UNLOADING)
    spare = resident("other", 8 * GiB, P.INTERACTIVE)
    # A transient dip (3 GiB instead of 5) must not cost `spare` its place.
    result = decide(
        demand("qwen", 6 * GiB, priority=P.PRODUCTION), 3 * GiB, [going, spare], may_evict=False
    )
    assert result.kind is PlanKind.WAIT
    assert result.victims == ()
