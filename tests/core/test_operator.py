"""Operator actions in the core, on a fake clock: evict, drain, pause."""

from __future__ import annotations

import attrs
import pytest

from gpugate.core.classes import PriorityClass, ResidencyPolicy
from gpugate.core.effects import Event, EventKind, Reject, Unload, UnloadReason
from gpugate.core.failures import FailureClass
from gpugate.core.operator import EvictionRefused, Refusal
from gpugate.core.units import GiB
from tests.core.builders import demand, gpu, host, make_core


def kinds(effects) -> list[EventKind]:
    return [e.kind for e in effects if isinstance(e, Event)]


@pytest.fixture
def core():
    core = make_core(max_wait=60.0, queue_limit=2)
    core.observe(host(gpu(), at=0.0), now=0.0)
    return core


def loaded(core, d, now):
    admission = core.submit(d, now)
    assert admission.lease is not None
    core.loaded(admission.lease.id, now)
    return admission.lease


def test_evict_refuses_unknown_always_warm_and_busy_and_unloads_with_operator_reason(core):
    d = demand("m", 2 * GiB, priority=PriorityClass.INTERACTIVE)
    with pytest.raises(EvictionRefused) as unknown:
        core.operator.evict(d.key, 1.0, False, "alice")
    assert unknown.value.refusal is Refusal.UNKNOWN
    lease = loaded(core, d, 1.0)
    with pytest.raises(EvictionRefused) as busy:
        core.operator.evict(d.key, 1.5, False, "alice")
    assert busy.value.refusal is Refusal.BUSY
    core.release(lease.id, 2.0)
    core.resident(d.key).policy = ResidencyPolicy.ALWAYS_WARM
    with pytest.raises(EvictionRefused) as warm:
        core.operator.evict(d.key, 2.5, False, "alice")
    assert warm.value.refusal is Refusal.ALWAYS_WARM
    effects = core.operator.evict(d.key, 3.0, True, "alice")
    [unload] = [e for e in effects if isinstance(e, Unload)]
    assert unload.reason is UnloadReason.OPERATOR and unload.key == d.key
    [started] = [e for e in effects if isinstance(e, Event)]
    assert started.kind is EventKind.EVICTION_STARTED and "asked by alice" in started.detail
    done = core.unloaded(d.key, 4.0, reclaimed=True)
    assert kinds(done) == [EventKind.EVICTION_DONE] and core.resident(d.key) is None


def test_a_drained_consumer_refuses_new_demands_and_is_drained_once_its_lease_ends(core):
    d = demand("m", 2 * GiB)
    lease = loaded(core, d, 1.0)
    assert kinds(core.operator.drain(d.consumer, 2.0, "bob")) == [EventKind.CONSUMER_DRAINING]
    refused = core.submit(demand("other", 1 * GiB), 2.5)
    assert refused.failure is not None
    assert refused.failure.failure_class is FailureClass.RESIDENCY_CONFLICT
    assert f"consumer {d.consumer} is draining" in refused.failure.message
    assert refused.failure.retry_after is not None
    assert core.operator.draining(d.consumer) == (True, False)
    assert EventKind.CONSUMER_DRAINED in kinds(core.release(lease.id, 3.0))
    assert core.operator.draining(d.consumer) == (True, True)
    assert core.leases() == [] and core.waiting() == []
    core.operator.undrain(d.consumer, 4.0, "bob")
    assert core.submit(demand("other", 1 * GiB), 5.0).lease is not None


def test_a_paused_gpu_queues_demands_until_resume_or_their_deadline(core):
    assert kinds(core.operator.pause(0, 1.0, "carol")) == [EventKind.GPU_PAUSED]
    first = core.submit(demand("a", 1 * GiB), 1.0)
    assert first.lease is None and first.failure is None
    second = core.submit(attrs.evolve(demand("b", 1 * GiB), max_wait=5.0), 1.0)
    assert len(core.waiting(0)) == 2
    assert [e for e in core.tick(3.0) if isinstance(e, Reject)] == []
    [timed_out] = [e for e in core.tick(6.5) if isinstance(e, Reject)]
    assert timed_out.ticket_id == second.ticket_id
    assert timed_out.failure.failure_class is FailureClass.LEASE_TIMEOUT
    core.observe(host(gpu(), at=7.0), now=7.0)
    assert len(core.waiting(0)) == 1, "a fresh sample does not plan a paused GPU"
    resumed = core.operator.resume(0, 7.0, "carol")
    assert kinds(resumed)[0] is EventKind.GPU_RESUMED
    assert [lease.id for lease in core.leases()] == [first.ticket_id]
    assert core.waiting() == []
