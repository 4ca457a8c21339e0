"""The core state machine on a fake clock: leases, queue, evictions, TTLs, failures."""

from __future__ import annotations

import pytest

from gpugate.core.classes import PriorityClass, ResidencyPolicy
from gpugate.core.effects import Event, EventKind, Grant, Reject, Unload, UnloadReason
from gpugate.core.failures import FailureClass
from gpugate.core.observation import DriverFault, HostObservation
from gpugate.core.residents import ANY_OPTIONS, ResidentKey, ResidentState
from gpugate.core.state import ListedModel
from gpugate.core.units import GiB, MiB
from tests.core.builders import demand, gpu, host, make_core, proc

P = PriorityClass


def of(effects, kind):
    return [e for e in effects if isinstance(e, kind)]


def events(effects, kind: EventKind):
    return [e for e in effects if isinstance(e, Event) and e.kind is kind]


@pytest.fixture
def core():
    core = make_core(max_wait=60.0, queue_limit=2)
    core.observe(host(gpu(), at=0.0), now=0.0)
    return core


def load(core, d, now, *, observed_after=None):
    """Submit, grant and complete the load of a demand; returns its lease."""
    admission = core.submit(d, now)
    assert admission.lease is not None, admission
    core.loaded(admission.lease.id, now)
    return admission.lease


def test_lease_lifecycle_load_release_ttl_unload(core):
    d = demand("gemma3:12b", 8 * GiB, ttl=900.0)
    admission = core.submit(d, 1.0)
    assert admission.lease is not None and admission.lease.pending == 8 * GiB
    assert core.resident(d.key).state is ResidentState.LOADING
    assert core.budget(0).consumer("ollama").committed == 8 * GiB

    core.loaded(admission.lease.id, 3.0)
    assert core.resident(d.key).state is ResidentState.RESIDENT
    assert core.lease(admission.lease.id).pending == 0
    assert core.budget(0).consumer("ollama").committed == 8 * GiB

    core.release(admission.lease.id, 10.0)
    assert core.leases() == []
    assert core.next_wakeup() == 910.0
    assert core.tick(909.0) == []
    unloads = of(core.tick(910.0), Unload)
    assert [(u.key, u.reason) for u in unloads] == [(d.key, UnloadReason.TTL)]
    core.observe(host(gpu(), at=911.0), 911.0)
    core.unloaded(d.key, 911.0, reclaimed=True)
    assert core.residents() == []


def test_a_second_request_for_a_resident_model_leases_nothing(core):
    first = load(core, demand("gemma", 8 * GiB), 1.0)
    second = core.submit(demand("gemma", 8 * GiB), 2.0)
    assert second.lease is not None and second.lease.pending == 0
    assert core.resident(first.key).in_flight == 2


def test_load_on_demand_unloads_right_after_the_last_request(core):
    d = demand("flux", 4 * GiB, policy=ResidencyPolicy.LOAD_ON_DEMAND, ttl=0.0)
    lease = load(core, d, 1.0)
    effects = core.release(lease.id, 5.0)
    assert [(u.key, u.reason) for u in of(effects, Unload)] == [(d.key, UnloadReason.TTL)]


def test_higher_class_evicts_idle_lower_and_is_granted_once_nvml_confirms(core):
    bg = demand("bge-m3", 6 * GiB, priority=P.BACKGROUND)
    lease = load(core, bg, 1.0)
    core.release(lease.id, 2.0)
    core.observe(host(gpu(proc(11, 6 * GiB, "ollama")), at=3.0), 3.0)

    want = demand("gemma", 9 * GiB, priority=P.INTERACTIVE)
    admission = core.submit(want, 4.0)
    assert admission.waiting
    unloads = of(admission.effects, Unload)
    assert [(u.key, u.reason, u.for_ticket) for u in unloads] == [
        (bg.key, UnloadReason.EVICTION, admission.ticket_id)
    ]
    # Nothing is granted until NVML shows the bytes back.
    core.observe(host(gpu(), at=5.0), 5.0)
    grants = of(core.unloaded(bg.key, 5.0, reclaimed=True), Grant)
    assert [g.ticket_id for g in grants] == [admission.ticket_id]
    assert grants[0].lease.pending == 9 * GiB
    assert grants[0].lease.waited == pytest.approx(1.0)


def test_memory_not_reclaimed_fails_the_ticket_it_was_for(core):
    bg = demand("bge-m3", 6 * GiB, priority=P.BACKGROUND)
    core.release(load(core, bg, 1.0).id, 2.0)
    admission = core.submit(demand("gemma", 9 * GiB, priority=P.PRODUCTION), 3.0)
    effects = core.unloaded(bg.key, 8.0, reclaimed=False)
    rejects = of(effects, Reject)
    assert [r.ticket_id for r in rejects] == [admission.ticket_id]
    assert rejects[0].failure.failure_class is FailureClass.GPU_MEMORY_NOT_RECLAIMED
    assert rejects[0].failure.retry_after is not None
    assert core.waiting() == [] and core.leases() == []


def test_queue_serves_the_higher_class_first_when_memory_frees():
    core = make_core(max_wait=2000.0)
    core.observe(host(gpu(), at=0.0), now=0.0)
    big = load(core, demand("holder", 12 * GiB, priority=P.PRODUCTION), 1.0)
    low = core.submit(demand("bench-model", 3 * GiB, priority=P.BENCHMARK), 2.0)
    high = core.submit(demand("chat-model", 3 * GiB, priority=P.INTERACTIVE), 3.0)
    assert low.waiting and high.waiting
    assert [t.id for t in core.waiting(0)] == [high.ticket_id, low.ticket_id]

    # The holder finishes but stays resident (production: neither may evict it); both wait
    # until its TTL unloads it, then both fit and are granted in class order.
    core.release(big.id, 4.0)
    assert core.waiting(0) != []
    unloads = of(core.tick(4.0 + 900.0), Unload)
    core.observe(host(gpu(), at=905.0), 905.0)
    grants = of(core.unloaded(unloads[0].key, 905.0, reclaimed=True), Grant)
    assert [g.ticket_id for g in grants] == [high.ticket_id, low.ticket_id]


def test_queue_full_per_consumer_and_nothing_left_behind(core):
    core.submit(demand("holder", 14 * GiB, priority=P.PRODUCTION), 1.0)
    first = core.submit(demand("a", 2 * GiB), 2.0)
    second = core.submit(demand("b", 2 * GiB), 3.0)
    third = core.submit(demand("c", 2 * GiB), 4.0)
    assert first.waiting and second.waiting
    assert third.failure is not None
    assert third.failure.failure_class is FailureClass.QUEUE_FULL
    assert third.failure.retry_after is not None
    assert {t.id for t in core.waiting()} == {first.ticket_id, second.ticket_id}


def test_a_waiting_ticket_times_out_with_lease_timeout(core):
    core.submit(demand("holder", 14 * GiB, priority=P.PRODUCTION), 1.0)
    waiting = core.submit(demand("a", 2 * GiB), 2.0)
    assert core.next_wakeup() == 62.0
    assert of(core.tick(61.9), Reject) == []
    rejects = of(core.tick(62.0), Reject)
    assert [r.ticket_id for r in rejects] == [waiting.ticket_id]
    failure = rejects[0].failure
    assert failure.failure_class is FailureClass.LEASE_TIMEOUT
    assert failure.failure_class.http_status == 503
    assert "LEASE_TIMEOUT: a needs 2.0 GiB" in failure.message
    assert core.waiting() == []


def test_cancel_removes_the_ticket_and_lets_the_next_one_in(core):
    core.submit(demand("holder", 10 * GiB, priority=P.PRODUCTION), 1.0)
    big = core.submit(demand("big", 8 * GiB, priority=P.INTERACTIVE), 2.0)
    small = core.submit(demand("small", 3 * GiB, priority=P.BACKGROUND), 3.0)
    assert big.waiting and small.waiting
    grants = of(core.cancel(big.ticket_id, 4.0), Grant)
    assert [g.ticket_id for g in grants] == [small.ticket_id]


def test_backfill_never_takes_what_the_head_waits_for(core):
    # 16 GiB card, 434 MiB reserved, 1 GiB reserve: ~14.6 GiB schedulable.
    busy = load(core, demand("busy-bg", 6 * GiB, priority=P.BACKGROUND), 1.0)
    head = core.submit(demand("head", 12 * GiB, priority=P.PRODUCTION), 2.0)
    assert head.waiting  # 8.6 free now + 6 when busy-bg is idle and evicted >= 12
    backfill_ok = core.submit(demand("tiny", 2 * GiB, priority=P.BACKGROUND), 3.0)
    assert backfill_ok.lease is not None  # 8.6 + 6 - 12 = 2.6 GiB of slack
    too_big = core.submit(demand("medium", 2 * GiB, priority=P.BACKGROUND), 4.0)
    assert too_big.waiting  # only 0.6 GiB of slack left
    effects = core.release(busy.id, 5.0)
    assert [u.key.model for u in of(effects, Unload)] == ["busy-bg"]


def test_two_requests_for_the_same_model_ride_on_one_load(core):
    first = core.submit(demand("gemma", 8 * GiB), 1.0)
    second = core.submit(demand("gemma", 8 * GiB), 1.5)
    assert first.lease is not None and second.waiting
    assert core.budget(0).consumer("ollama").pending == 8 * GiB
    grants = of(core.loaded(first.lease.id, 3.0), Grant)
    assert [(g.ticket_id, g.lease.pending) for g in grants] == [(second.ticket_id, 0)]


def test_a_failed_load_leaves_no_resident_and_no_lease(core):
    admission = core.submit(demand("gemma", 8 * GiB), 1.0)
    core.release(admission.lease.id, 2.0, failed=True)
    assert core.residents() == [] and core.leases() == []
    assert core.budget(0).consumer("ollama").committed == 0


def test_stale_sample_and_driver_fault_fail_closed_for_new_loads(core):
    stale = core.submit(demand("gemma", 1 * GiB), 10.0)
    assert stale.failure.failure_class is FailureClass.SCHEDULER_STATE_STALE
    assert "10.0s old" in stale.failure.message
    core.observe(
        HostObservation(11.0, 11.0, error=DriverFault(15, "GpuIsLost", "GPU is lost")), 11.0
    )
    fault = core.submit(demand("gemma", 1 * GiB), 11.0)
    assert fault.failure.failure_class is FailureClass.DRIVER_ERROR
    assert "GpuIsLost (15)" in fault.failure.message


def test_resident_requests_still_pass_while_nvml_is_down(core):
    lease = load(core, demand("gemma", 1 * GiB), 1.0)
    core.observe(HostObservation(2.0, 2.0, error=DriverFault(15, "GpuIsLost", "lost")), 2.0)
    again = core.submit(demand("gemma", 1 * GiB), 3.0)
    assert again.lease is not None and again.lease.pending == 0
    core.release(lease.id, 4.0)


def test_out_of_band_load_becomes_a_resident_and_is_evicted_like_any_other(core):
    core.observe(host(gpu(proc(66, 8 * GiB, "ollama")), at=1.0), 1.0)
    assert core.budget(0).consumer("ollama").unexplained == 8 * GiB
    listed = ListedModel(
        "gemma3:12b", 8 * GiB, 8 * GiB, P.BACKGROUND, ResidencyPolicy.KEEP_WARM, 900.0
    )
    effects = core.reconcile("ollama", 0, [listed], asked_at=1.0, now=1.5)
    key = ResidentKey("ollama", "gemma3:12b", ANY_OPTIONS)
    assert [e.key for e in events(effects, EventKind.OUT_OF_BAND_RESIDENT)] == [key]
    assert core.budget(0).consumer("ollama").unexplained == 0
    assert core.budget(0).consumer("ollama").committed == 8 * GiB
    admission = core.submit(demand("qwen", 8 * GiB, priority=P.INTERACTIVE), 2.0)
    assert [u.key for u in of(admission.effects, Unload)] == [key]


def test_reconcile_drops_what_the_runtime_no_longer_lists_but_not_fresh_loads(core):
    old = load(core, demand("old", 2 * GiB), 1.0)
    core.release(old.id, 2.0)
    fresh = load(core, demand("fresh", 2 * GiB), 5.0)
    core.release(fresh.id, 6.0)
    effects = core.reconcile("ollama", 0, [], asked_at=4.0, now=7.0)
    assert [e.model for e in events(effects, EventKind.RESIDENT_GONE)] == ["old"]
    assert [r.key.model for r in core.residents()] == ["fresh"]


def test_partial_offload_is_reported_once(core):
    lease = load(core, demand("gemma", 8 * GiB), 1.0)
    listed = ListedModel("gemma", 6 * GiB, 8 * GiB, P.INTERACTIVE, ResidencyPolicy.KEEP_WARM, 900.0)
    first = core.reconcile("ollama", 0, [listed], asked_at=2.0, now=2.0)
    again = core.reconcile("ollama", 0, [listed], asked_at=3.0, now=3.0)
    assert len(events(first, EventKind.PARTIAL_OFFLOAD)) == 1
    assert events(again, EventKind.PARTIAL_OFFLOAD) == []
    assert core.resident(lease.key).bytes == 6 * GiB


def test_external_pressure_gives_idle_memory_back_and_clears_with_hysteresis(core):
    lease = load(core, demand("bg", 4 * GiB, priority=P.BACKGROUND), 1.0)
    core.release(lease.id, 2.0)
    # Plex grabs 11 GiB: 4 + 11 + 0.42 + 1 reserve > 16.
    effects = core.observe(
        host(gpu(proc(5, 4 * GiB, "ollama"), proc(9, 11 * GiB, "plex", managed=False)), at=3.0),
        3.0,
    )
    (entered,) = events(effects, EventKind.PRESSURE_ENTERED)
    assert entered.failure.failure_class is FailureClass.EXTERNAL_GPU_PRESSURE
    assert "external 11.0 GiB: plex 11.0" in entered.failure.message
    assert [(u.key.model, u.reason) for u in of(effects, Unload)] == [("bg", UnloadReason.PRESSURE)]
    core.unloaded(lease.key, 4.0, reclaimed=True)
    cleared = core.observe(host(gpu(proc(9, 11 * GiB, "plex", managed=False)), at=4.0), 4.0)
    assert events(cleared, EventKind.PRESSURE_CLEARED)
    assert not core.in_pressure(0)


def test_reserve_grows_with_external_volatility():
    core = make_core(reserve=1 * GiB, reserve_max=3 * GiB)
    core.observe(host(gpu(proc(9, 1 * GiB, "plex", managed=False)), at=0.0), 0.0)
    assert core.budget(0).reserve == 1 * GiB
    core.observe(host(gpu(proc(9, 1500 * MiB, "plex", managed=False)), at=1.0), 1.0)
    core.observe(host(gpu(), at=2.0), 2.0)
    assert core.budget(0).reserve == 1 * GiB + 1500 * MiB
    core.observe(host(gpu(proc(9, 1500 * MiB, "plex", managed=False)), at=3.0), 3.0)
    assert core.budget(0).reserve == 1 * GiB


def test_model_larger_than_the_card_is_refused_with_an_actionable_message(core):
    core.observe(
        host(gpu(proc(9, 3 * GiB, "plex", managed=False), proc(5, 200 * MiB, "ollama")), at=1.0),
        1.0,
    )
    admission = core.submit(demand("gemma3:12b", 14 * GiB, priority=P.INTERACTIVE), 1.0)
    failure = admission.failure
    assert failure.failure_class is FailureClass.INSUFFICIENT_SCHEDULABLE_VRAM
    assert failure.message.startswith("INSUFFICIENT_SCHEDULABLE_VRAM: gemma3:12b needs 14.0 GiB, ")
    assert "schedulable on GPU 0; at most 11.4 GiB could ever be freed for it, 2.6 GiB short;" in (
        failure.message
    )
    assert "the rest is held by: ollama beyond its leases 0.2 GiB, the reserve 1.0 GiB, " in (
        failure.message
    )
    assert "external 3.0 GiB: plex 3.0, the driver 0.4 GiB" in failure.message
    assert failure.retry_after == 30.0


def test_a_new_sample_while_evicting_does_not_evict_more(core):
    bg = demand("bge-m3", 2 * GiB, priority=P.BACKGROUND)
    core.release(load(core, bg, 1.0).id, 1.5)
    keep = demand("gemma", 8 * GiB, priority=P.INTERACTIVE)
    core.release(load(core, keep, 2.0).id, 2.5)
    core.observe(host(gpu(proc(1, 2 * GiB, "ollama"), proc(2, 8 * GiB, "ollama")), at=3.0), 3.0)
    admission = core.submit(demand("qwen", 5700 * MiB, priority=P.PRODUCTION), 3.0)
    assert [u.key.model for u in of(admission.effects, Unload)] == ["bge-m3"]
    again = core.observe(
        host(gpu(proc(1, 2 * GiB, "ollama"), proc(2, 8 * GiB, "ollama")), at=3.2), 3.2
    )
    assert of(again, Unload) == []
    assert core.resident(keep.key).state is ResidentState.RESIDENT
