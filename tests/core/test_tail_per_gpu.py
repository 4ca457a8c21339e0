"""A queue's plan is kept per GPU (`Books.stamp`): an arrival on one card is planned from
what the last pass over that card left, and another card's arrivals do not make it plan
again. Property: on a host of two cards, whatever happened before, arrivals on the other
card in between never change how an arrival on this one is decided."""

from __future__ import annotations

import copy

import hypothesis.strategies as st
from hypothesis import HealthCheck, given, settings

from gpugate.core.classes import PriorityClass
from gpugate.core.effects import Event, Grant, Reject, Unload
from gpugate.core.planner import PlannerSettings
from gpugate.core.pressure import ReserveSettings
from gpugate.core.state import CoreSettings, GateCore
from gpugate.core.units import GiB
from tests.core.builders import demand, gpu, host

P = PriorityClass
CONSUMERS = {"left": 0, "right": 1}
NOW = 5.0

ops = st.lists(
    st.tuples(
        st.sampled_from(sorted(CONSUMERS)),
        st.sampled_from(["m1", "m2", "m3", "m4"]),
        st.integers(1, 9),
        st.sampled_from([P.BACKGROUND, P.INTERACTIVE, P.PRODUCTION]),
        st.sampled_from(["submit", "load", "release"]),
    ),
    min_size=1,
    max_size=30,
)


def two_cards() -> GateCore:
    core = GateCore(
        CoreSettings(
            reserve=ReserveSettings(GiB, GiB),
            max_wait={p: 60.0 for p in P},
            consumer_gpus=dict(CONSUMERS),
            queue_limit={c: 32 for c in CONSUMERS},
            planner=PlannerSettings(equal_class_grace=30.0),
            reconcilable=frozenset(CONSUMERS),
        )
    )
    core.observe(host(gpu(index=0), gpu(index=1), at=NOW), NOW)
    return core


def decided(effects) -> list[tuple[str, object]]:
    """What an arrival decided, without ids the two copies may number alike anyway."""
    out: list[tuple[str, object]] = []
    for effect in effects:
        if isinstance(effect, Grant):
            out.append(("grant", (effect.lease.key, effect.lease.pending)))
        elif isinstance(effect, Reject):
            out.append(("reject", effect.failure.failure_class))
        elif isinstance(effect, Unload):
            out.append(("unload", effect.key))
        elif isinstance(effect, Event):
            out.append(("event", (effect.kind, effect.key)))
    return out


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops, st.lists(st.integers(0, 4), min_size=1, max_size=10), st.integers(1, 12))
def test_tickets_queued_on_another_card_never_change_how_an_arrival_is_decided(
    history, queued, gib
):
    core = two_cards()
    # An idle production model holds the right card for 30 s more: what arrives there
    # waits for it in the queue (within its 60 s wait).
    hold = demand("hold", 12 * GiB, priority=P.PRODUCTION, consumer="right", gpu_index=1, ttl=30)
    held = core.submit(hold, NOW).lease
    assert held is not None
    core.loaded(held.id, NOW)
    core.release(held.id, NOW)
    open_leases: list[int] = []
    for _, name, size, klass, op in history:
        wanted = demand(name, size * GiB, priority=klass, consumer="left", gpu_index=0)
        if op == "submit":
            admission = core.submit(wanted, NOW)
            if admission.lease is not None:
                open_leases.append(admission.lease.id)
        elif op == "load" and open_leases:
            core.loaded(open_leases[-1], NOW)
        elif op == "release" and open_leases:
            core.release(open_leases.pop(0), NOW)
    busier = copy.deepcopy(core)
    for n, extra in enumerate(queued):
        wanted = demand(f"w{n}", (5 + extra) * GiB, consumer="right", gpu_index=1)
        assert busier.submit(wanted, NOW).waiting
    arrival = demand("next", gib * GiB, priority=P.INTERACTIVE, consumer="left", gpu_index=0)
    a, b = core.submit(arrival, NOW), busier.submit(arrival, NOW)
    assert (a.lease is None, a.waiting) == (b.lease is None, b.waiting)
    assert decided(a.effects) == decided(b.effects)
    assert [t.demand.key for t in core.waiting(0)] == [t.demand.key for t in busier.waiting(0)]
