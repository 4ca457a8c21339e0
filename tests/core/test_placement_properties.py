"""Properties of loads placed across two cards, some split into a part per card: whatever the
order of arrivals, loads, releases, unloads, expiries and samples, no grant over-commits
either card, a split model's parts are evicted together (never one resident while another
unloads), every part's lease ends with its request (a request's leases end together,
`GateCore.release_all`), and the per-card sums the books carry are a recount."""

from __future__ import annotations

import attrs
import hypothesis.strategies as st
from hypothesis import HealthCheck, example, given, settings

from gpugate.core.classes import PriorityClass
from gpugate.core.effects import Grant, Unload
from gpugate.core.placement import Placing, place
from gpugate.core.residents import ResidentState
from gpugate.core.units import GiB
from tests.core.builders import assert_sums_recounted, demand, host, proc
from tests.core.test_placement import CARDS, RULE, cards, core_on

P = PriorityClass
MODELS = {"a": 6, "b": 11, "c": 18, "d": 28, "e": 34}
"""GiB: a and b fit either card, c only the 24 GiB one, d and e split."""

steps = st.lists(
    st.tuples(
        st.sampled_from(
            ["arrive", "misplaced", "loaded", "release", "unloaded", "sample", "expire"]
        ),
        st.sampled_from(sorted(MODELS)),
        st.sampled_from([P.BACKGROUND, P.INTERACTIVE, P.PRODUCTION]),
        st.sampled_from(CARDS),
    ),
    min_size=1,
    max_size=40,
)


UNLOAD_THEN_OTHER_CARD = [
    ("arrive", "a", P.INTERACTIVE, 0),
    ("loaded", "a", P.INTERACTIVE, 0),
    ("release", "a", P.INTERACTIVE, 0),
    ("expire", "a", P.INTERACTIVE, 0),
    ("sample", "a", P.INTERACTIVE, 0),
    ("misplaced", "a", P.INTERACTIVE, 1),
    ("sample", "a", P.INTERACTIVE, 0),
    ("unloaded", "a", P.INTERACTIVE, 0),
    ("sample", "a", P.INTERACTIVE, 0),
    ("loaded", "a", P.INTERACTIVE, 0),
]
"""A model asked for on the other card while its unload runs: the books once counted the
unloading copy off that card (a sum below zero) and the unload's end took the new load out."""


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps)
@example(UNLOAD_THEN_OTHER_CARD)
def test_split_loads_keep_every_card_within_its_budget(ops):
    core = core_on(*cards())
    now = 1.0
    held: dict[int, list] = {}  # request number -> its leases
    waiting: dict[int, int] = {}  # ticket id -> request number
    unloads: list[Unload] = []
    request = 0

    def apply(effects):
        for effect in effects:
            if isinstance(effect, Grant):
                number = waiting.pop(effect.ticket_id, None)
                if number is not None:
                    held.setdefault(number, []).append(effect.lease)
                if effect.lease.pending:
                    for g in CARDS:
                        budget = core.budget(g)
                        assert budget is None or budget.schedulable >= 0
            elif isinstance(effect, Unload):
                unloads.append(effect)

    for kind, model, priority, card in ops:
        now += 1.0
        if kind in ("arrive", "misplaced"):
            request += 1
            d = demand(model, MODELS[model] * GiB, priority=priority, resident_priority=priority)
            placement = place(core, d, CARDS, now, placing=Placing.RUNTIME, rule=RULE)
            parts = placement.demands(d)
            if kind == "misplaced" and MODELS[model] < 16:
                # Placed by a prediction that no longer holds (another card's memory moved
                # in between): the same model may end up asked for on two cards.
                parts = (attrs.evolve(d, gpu=card),)
            for part in parts:
                admission = core.submit(part, now)
                apply(admission.effects)
                if admission.lease is not None:
                    held.setdefault(request, []).append(admission.lease)
                    if admission.lease.pending:
                        for g in CARDS:
                            budget = core.budget(g)
                            assert budget is not None and budget.schedulable >= 0
                elif admission.failure is None:
                    waiting[admission.ticket_id] = request
        elif kind == "loaded" and held:
            number = min(held)
            for lease in held[number]:
                apply(core.loaded(lease.id, now))
        elif kind == "release" and (done := [n for n in held if n not in waiting.values()]):
            # A request ends once all its parts were granted (the gate acquires them before
            # it forwards the request): never one part while another still waits.
            number = min(done)
            apply(core.release_all([lease.id for lease in held.pop(number)], now))
        elif kind == "unloaded" and unloads:
            unload = unloads.pop(0)
            apply(core.unloaded(unload.key, now, reclaimed=True))
        elif kind == "expire":
            # Every idle model's TTL runs out: its unload begins, and a request for it
            # may follow on either card while it runs.
            now += 1000.0
            apply(core.tick(now))
        elif kind == "sample":
            # NVML shows what the books hold as resident, as a runtime that loaded it would.
            used = {g: 0 for g in CARDS}
            for resident in core.residents():
                if resident.state is not ResidentState.LOADING:
                    used[resident.gpu] += resident.bytes
            observed = cards(
                used0=[proc(10, used[0], "ollama")] if used[0] else [],
                used1=[proc(11, used[1], "ollama")] if used[1] else [],
            )
            apply(core.observe(host(*observed, at=now), now))
        # A load in the books is some request's: no loading resident without its lease.
        loading = {lease.key for lease in core.books.leases.values() if lease.pending}
        for resident in core.residents():
            if resident.state is ResidentState.LOADING:
                assert resident.key in loading, resident
        # A split model's parts go together.
        wholes = {r.key.whole for r in core.residents() if r.key.part is not None}
        for whole in wholes:
            states = {p.state for p in core.books.parts_of(whole)}
            assert not (ResidentState.RESIDENT in states and ResidentState.UNLOADING in states)
        assert_sums_recounted(core)
    # Every request's leases end with it (a release may grant a waiting one: it ends too).
    for ticket_id in list(waiting):
        apply(core.cancel(ticket_id, now))
        waiting.pop(ticket_id, None)
    while held:
        apply(core.release_all([lease.id for lease in held.pop(min(held))], now))
    assert not core.books.leases
