"""What each waiting demand waits for (`gpugate.core.waits`): one case per reason on a fake
clock, and that the view covers the queue in order and changes nothing (hypothesis)."""

from __future__ import annotations

import hypothesis.strategies as st
from hypothesis import HealthCheck, given, settings

from gpugate.core.classes import PriorityClass
from gpugate.core.effects import Unload
from gpugate.core.explain import refusal_line
from gpugate.core.failures import Failure, FailureClass
from gpugate.core.residents import ResidentKey
from gpugate.core.state import GateCore
from gpugate.core.units import GiB, format_gib
from gpugate.core.waits import Hold, WaitReason, queue_view
from tests.core.builders import demand, gpu, host, make_core

P = PriorityClass
A = ResidentKey("ollama", "a")


def fresh(**kw) -> GateCore:
    core = make_core(**{"stale_after": 1000.0, **kw})
    core.observe(host(gpu(), at=0.0), 0.0)
    return core


def load(core: GateCore, model: str, envelope: int, now: float, *, release=True, **kw) -> int:
    """Load a model through a lease (and end its request); returns the lease id."""
    admission = core.submit(demand(model, envelope, **kw), now)
    assert admission.lease is not None, admission
    core.loaded(admission.lease.id, now)
    if release:
        core.release(admission.lease.id, now)
    return admission.lease.id


def waits_for(core: GateCore, model: str, envelope: int, now: float, **kw) -> int:
    admission = core.submit(demand(model, envelope, **kw), now)
    assert admission.waiting, admission
    return admission.ticket_id


# 16 GiB card, 434 MiB driver reserved, 1 GiB reserve: about 14.6 GiB schedulable.


def test_an_idle_holder_of_its_own_class_is_waited_for_until_its_grace_ends():
    core = fresh(grace=30.0)
    load(core, "a", 10 * GiB, 1.0)
    ticket = waits_for(core, "b", 10 * GiB, 5.0)
    (row,) = queue_view(core, 6.0)
    assert (row.ticket, row.position, row.model, row.priority) == (ticket, 0, "b", P.INTERACTIVE)
    wait = row.wait
    assert (wait.reason, wait.hold, wait.holder, wait.until) == (
        WaitReason.HOLDER_GRACE,
        Hold.GRACE,
        A,
        31.0,
    )
    schedulable = core.budget(0).schedulable
    assert wait.short == 10 * GiB - schedulable > 0
    assert "equal-class grace" in wait.line and "ollama/a" in wait.line
    assert row.deadline == 65.0 and row.arrived == 5.0


def test_a_higher_class_holder_is_waited_for_until_its_idle_ttl():
    core = fresh(max_wait=120.0)
    load(core, "a", 10 * GiB, 1.0, ttl=60.0)
    waits_for(core, "b", 10 * GiB, 2.0, priority=P.BACKGROUND)
    (row,) = queue_view(core, 3.0)
    assert (row.wait.reason, row.wait.hold, row.wait.until) == (
        WaitReason.HOLDER_GRACE,
        Hold.KEEP_WARM,
        61.0,
    )
    assert "idle ttl" in row.wait.line and "58s" in row.wait.line


def test_a_busy_holder_is_waited_for_until_it_is_idle():
    core = fresh()
    load(core, "a", 10 * GiB, 1.0, release=False)
    waits_for(core, "b", 10 * GiB, 2.0)
    (row,) = queue_view(core, 3.0)
    assert (row.wait.reason, row.wait.holder, row.wait.until) == (WaitReason.HOLDER_BUSY, A, None)
    assert "busy" in row.wait.line


def test_an_eviction_under_way_is_an_unload_and_a_second_ticket_rides_on_the_first():
    core = fresh()
    load(core, "a", 10 * GiB, 1.0, priority=P.BACKGROUND)
    first = core.submit(demand("b", 10 * GiB), 2.0)
    assert any(isinstance(e, Unload) for e in first.effects)
    second = waits_for(core, "b", 10 * GiB, 3.0)
    head, rider = queue_view(core, 4.0)
    assert (head.wait.reason, head.wait.unloading) == (WaitReason.UNLOAD, (A,))
    assert head.wait.line.startswith("its evictions are under way: ollama/a")
    assert (rider.ticket, rider.position) == (second, 1)
    assert (rider.wait.reason, rider.wait.behind) == (WaitReason.SAME_MODEL, first.ticket_id)


def test_a_paused_gpu_says_who_paused_it():
    core = fresh()
    core.operator.pause(0, 1.0, "carol")
    waits_for(core, "b", 1 * GiB, 2.0)
    (row,) = queue_view(core, 62.0)
    assert row.wait.reason is WaitReason.PAUSED
    assert row.wait.line == "admission on GPU 0 was paused by carol 1m1s ago: waits for resume"


def test_a_demand_that_would_fit_but_for_the_tickets_ahead_waits_behind_the_head():
    core = fresh()
    load(core, "a", 8 * GiB, 1.0)
    head = waits_for(core, "b", 10 * GiB, 2.0)
    # What b keeps back of what a will not cover leaves too little for c, which would fit
    # in what is schedulable were b not ahead of it.
    waits_for(core, "c", 5 * GiB, 3.0, priority=P.BACKGROUND)
    first, second = queue_view(core, 4.0)
    assert first.wait.reason is WaitReason.HOLDER_GRACE
    assert core.budget(0).schedulable >= 5 * GiB
    assert (second.position, second.wait.reason, second.wait.behind) == (
        1,
        WaitReason.HEAD_OF_LINE,
        head,
    )
    assert f"the first {head} (ollama/b" in second.wait.line


def test_a_demand_whose_holder_goes_first_to_a_ticket_ahead_waits_behind_that_ticket():
    core = fresh()
    load(core, "a", 10 * GiB, 1.0)
    head = waits_for(core, "b", 6 * GiB, 2.0)
    waits_for(core, "c", 6 * GiB, 3.0)
    first, second = queue_view(core, 4.0)
    assert (first.wait.reason, first.wait.holder) == (WaitReason.HOLDER_GRACE, A)
    assert (second.wait.reason, second.wait.behind, second.wait.holder) == (
        WaitReason.HEAD_OF_LINE,
        head,
        A,
    )
    assert second.wait.short > 0
    assert f"what ollama/a frees goes first to ticket {head} ahead of it" in second.wait.line


def test_a_stale_sample_is_waited_out():
    core = fresh(stale_after=5.0)
    load(core, "a", 10 * GiB, 1.0)
    waits_for(core, "b", 10 * GiB, 2.0)
    (row,) = queue_view(core, 20.0)
    assert row.wait.reason is WaitReason.SAMPLE
    assert "sample is 20.0s old" in row.wait.line


def test_the_reserve_says_what_it_is_made_of():
    core = make_core(reserve=1 * GiB, reserve_max=2 * GiB)
    from tests.core.builders import proc

    core.observe(host(gpu(proc(9, 3 * GiB, "plex", managed=False)), at=0.0), 0.0)
    core.observe(host(gpu(), at=1.0), 1.0)
    why = core.telemetry.reserve_why(0)
    assert (why.peak, why.current, why.reserve, why.capped) == (3 * GiB, 0, 2 * GiB, True)
    assert why.reserve == core.budget(0).reserve
    assert why.line() == (
        "base 1.0 GiB + 3.0 GiB external use may rebound (from 0.0 GiB to its peak of "
        "3.0 GiB in the last 10m), capped at reserve_max 2.0 GiB"
    )


# -- any queue -----------------------------------------------------------------------------

MODELS = ("a", "b", "c", "d")
step = st.tuples(
    st.sampled_from(("submit", "release", "tick")),
    st.sampled_from(MODELS),
    st.sampled_from((2 * GiB, 6 * GiB, 9 * GiB)),
    st.sampled_from((P.BACKGROUND, P.INTERACTIVE)),
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(step, min_size=1, max_size=25))
def test_the_view_covers_the_queue_in_order_and_changes_nothing(steps):
    core = fresh(max_wait=300.0, grace=10.0)
    now = 0.0
    leases: list[int] = []
    seen: set[WaitReason] = set()
    for action, model, envelope, priority in steps:
        now += 1.0
        if action == "submit":
            admission = core.submit(demand(model, envelope, priority=priority), now)
            if admission.lease is not None:
                core.loaded(admission.lease.id, now)
                leases.append(admission.lease.id)
        elif action == "release" and leases:
            core.release(leases.pop(0), now)
        else:
            core.tick(now)
        stamp = (core.books.stamp(0), core.books.residents_version, dict(core.scheduler.plans))
        rows = queue_view(core, now)
        assert (core.books.stamp(0), core.books.residents_version) == stamp[:2]
        assert core.scheduler.plans == stamp[2]
        assert [r.ticket for r in rows] == [t.id for t in core.waiting(0)]
        assert [r.position for r in rows] == list(range(len(rows)))
        for row in rows:
            assert row.wait.line
            assert row.wait.short >= 0
            wait = row.wait
            seen.add(wait.reason)
            if wait.reason is WaitReason.HEAD_OF_LINE or wait.behind is not None:
                assert wait.behind in [r.ticket for r in rows[: row.position]]
            if wait.reason in (WaitReason.HOLDER_GRACE, WaitReason.HOLDER_BUSY):
                holder = core.books.residents.get(wait.holder)
                assert holder is not None and holder.key != row.demand.key
                assert (wait.reason is WaitReason.HOLDER_BUSY) == (not holder.idle)
            if wait.reason is WaitReason.HOLDER_GRACE and wait.until is not None:
                assert wait.until > now
            if wait.reason is WaitReason.UNLOAD:
                assert wait.unloading
                assert all(k in core.books.unloads for k in wait.unloading)
            if wait.reason is WaitReason.HEAD_OF_LINE and wait.short:
                # Short of bytes: what it waits for goes first to the ticket ahead.
                assert wait.holder in core.scheduler.plans[wait.behind].counting_on


# -- refusals in one line ----------------------------------------------------------------------


def test_a_refusal_in_one_line_says_its_class_what_it_needed_and_why():
    core = fresh()
    admission = core.submit(demand("huge", 20 * GiB), 1.0)
    assert admission.failure is not None
    failure = admission.failure
    schedulable = core.budget(0).schedulable
    assert refusal_line(failure) == (
        f"INSUFFICIENT_SCHEDULABLE_VRAM: huge needs 20.0 GiB, {format_gib(schedulable)} "
        "schedulable on GPU 0: more than could ever be freed for it"
    )
    assert len(failure.message) > len(refusal_line(failure))
    draining = Failure(
        FailureClass.RESIDENCY_CONFLICT,
        "RESIDENCY_CONFLICT: consumer ollama is draining",
        consumer="ollama",
    )
    assert refusal_line(draining) == "RESIDENCY_CONFLICT: consumer ollama is draining"
    crash = Failure(FailureClass.RUNTIME_CRASH, "RUNTIME_CRASH: ...", consumer="ollama")
    assert refusal_line(crash) == "RUNTIME_CRASH: ollama is not answering"
