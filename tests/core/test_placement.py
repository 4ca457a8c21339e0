"""Placement among a consumer's GPUs (gpugate.core.placement): the gate's choice for a runtime
it starts, the runtime's own rule predicted, a split load as one part per GPU, and a split
model's parts evicted, listed and unloaded together."""

from __future__ import annotations

from collections.abc import Sequence

import attrs

from gpugate.core.classes import PriorityClass, ResidencyPolicy
from gpugate.core.effects import Event, EventKind, Grant, Unload
from gpugate.core.listing import ListedModel
from gpugate.core.placement import Card, Placing, Share, place
from gpugate.core.planner import PlannerSettings
from gpugate.core.pressure import ReserveSettings
from gpugate.core.residents import ResidentKey, ResidentState
from gpugate.core.state import CoreSettings, GateCore
from gpugate.core.units import GiB
from gpugate.core.waits import WaitReason, queue_view
from tests.core.builders import demand, gpu, host, proc

P = PriorityClass
CARDS = (0, 1)
BIG, SMALL = 24 * GiB, 16 * GiB


@attrs.frozen
class MostFreeElseSplit:
    """A runtime's rule like Ollama's: the card with the most free memory where the load
    fits in 80 % of it, else split across all in proportion to their free memory."""

    def place(self, nbytes: int, cards: Sequence[Card]) -> tuple[Share, ...] | None:
        fitting = [c for c in cards if nbytes <= c.free * 80 // 100]
        if fitting:
            best = max(fitting, key=lambda c: (c.free, -cards.index(c)))
            return (Share(best.gpu, nbytes),)
        total = sum(c.free for c in cards)
        if total < nbytes:
            return None
        shares = [Share(c.gpu, nbytes * c.free // total) for c in cards[:-1]]
        return (*shares, Share(cards[-1].gpu, nbytes - sum(s.bytes for s in shares)))


RULE = MostFreeElseSplit()
KEEP_WARM = ResidencyPolicy.KEEP_WARM


def core_on(*observations, at: float = 1.0) -> GateCore:
    core = GateCore(
        CoreSettings(
            reserve=ReserveSettings(0, 0),
            max_wait={p: 60.0 for p in P},
            consumer_gpus={"ollama": CARDS, "whisper": CARDS},
            queue_limit={"ollama": 32, "whisper": 32},
            planner=PlannerSettings(equal_class_grace=30.0),
            reconcilable=frozenset({"ollama"}),
        )
    )
    core.observe(host(*observations, at=at), at)
    return core


def cards(used0: Sequence = (), used1: Sequence = ()):
    return (
        gpu(*used0, index=0, total=BIG, reserved=0),
        gpu(*used1, index=1, total=SMALL, reserved=0),
    )


def load(core: GateCore, d, now: float = 1.0):
    """Submit and complete a load; returns the lease."""
    admission = core.submit(d, now)
    assert admission.lease is not None, admission
    core.loaded(admission.lease.id, now)
    core.release(admission.lease.id, now)
    return admission.lease


def test_the_gate_places_a_start_where_it_fits_without_evicting():
    core = core_on(*cards())
    load(core, demand("gemma", 20 * GiB, priority=P.BACKGROUND))
    core.observe(host(*cards(used0=[proc(10, 20 * GiB, "ollama")]), at=2.0), 2.0)
    placement = place(core, demand("whisper", 3 * GiB, consumer="whisper"), CARDS, 2.0)
    assert [s.gpu for s in placement.shares] == [1]
    assert not placement.split and not placement.predicted


def test_the_gate_takes_the_card_with_fewer_evictions():
    core = core_on(*cards())
    load(core, demand("a", 5 * GiB, priority=P.BACKGROUND))
    load(core, demand("b", 6 * GiB, priority=P.BACKGROUND))
    load(core, demand("c", 14 * GiB, priority=P.BACKGROUND, gpu_index=1))
    used = cards(used0=[proc(10, 11 * GiB, "ollama")], used1=[proc(11, 14 * GiB, "ollama")])
    core.observe(host(*used, at=2.0), 2.0)
    # 20 GiB for a production start: card 0 must lose a and b (13 GiB free + 11), card 1
    # cannot hold it at all; a 15 GiB start fits card 0 after evicting one of them or card 1
    # after evicting c: one eviction each, and card 0 has more room.
    twenty = place(core, demand("w", 20 * GiB, consumer="whisper", priority=P.PRODUCTION), CARDS, 2)
    assert [s.gpu for s in twenty.shares] == [0]
    assert "evicting" in twenty.why
    fifteen = demand("w", 15 * GiB, consumer="whisper", priority=P.PRODUCTION)
    placed = place(core, fifteen, CARDS, 2.0)
    assert [s.gpu for s in placed.shares] == [0]


def test_among_cards_that_fit_the_one_with_most_room():
    core = core_on(*cards())
    placed = place(core, demand("w", 3 * GiB, consumer="whisper"), CARDS, 1.0)
    assert [s.gpu for s in placed.shares] == [0]
    core = core_on(*cards())
    load(core, demand("x", 12 * GiB))
    core.observe(host(*cards(used0=[proc(10, 12 * GiB, "ollama")]), at=2.0), 2.0)
    placed = place(core, demand("w", 3 * GiB, consumer="whisper"), CARDS, 2.0)
    assert [s.gpu for s in placed.shares] == [1]


def test_a_resident_model_is_served_where_it_is():
    core = core_on(*cards())
    load(core, demand("gemma", 8 * GiB, gpu_index=1))
    placed = place(core, demand("gemma", 8 * GiB), CARDS, 2.0, placing=Placing.RUNTIME, rule=RULE)
    assert [s.gpu for s in placed.shares] == [1]
    assert "is on GPU 1" in placed.why


def test_the_runtime_rule_is_predicted_from_free_memory_less_pending_loads():
    core = core_on(*cards())
    # A load leased on card 0 and not shown yet: the runtime will find it allocated.
    admission = core.submit(demand("big", 12 * GiB), 1.0)
    assert admission.lease is not None
    placed = place(core, demand("m", 8 * GiB), CARDS, 1.0, placing=Placing.RUNTIME, rule=RULE)
    assert [s.gpu for s in placed.shares] == [1]
    assert placed.predicted


def test_a_split_that_fits_is_taken_rather_than_an_eviction():
    core = core_on(*cards())
    load(core, demand("idle", 10 * GiB, priority=P.BACKGROUND))
    core.observe(host(*cards(used0=[proc(10, 10 * GiB, "ollama")]), at=2.0), 2.0)
    # 18 GiB: 80 % of card 0's 14 GiB free is 11.2, of card 1's 16 is 12.8: the runtime
    # splits it over the 30 GiB free, and nothing needs to go for that.
    placed = place(core, demand("large", 18 * GiB), CARDS, 2.0, placing=Placing.RUNTIME, rule=RULE)
    assert [s.gpu for s in placed.shares] == [0, 1]
    assert "free memory it sees" in placed.why


def test_a_load_that_fits_nowhere_is_loaded_whole_after_evicting_on_one_card():
    core = core_on(*cards())
    load(core, demand("idle", 12 * GiB, priority=P.BACKGROUND))
    used = cards(
        used0=[proc(10, 12 * GiB, "ollama")], used1=[proc(20, 10 * GiB, "plex", managed=False)]
    )
    core.observe(host(*used, at=2.0), 2.0)
    # 19 GiB: 12 + 6 GiB free is not enough even split; with idle gone card 0 has 24 free,
    # and 19 is within 80 % of it: the runtime loads it whole there.
    d = demand("large", 19 * GiB, priority=P.INTERACTIVE)
    placed = place(core, d, CARDS, 2.0, placing=Placing.RUNTIME, rule=RULE)
    assert [s.gpu for s in placed.shares] == [0]
    assert "whole" in placed.why


def test_a_split_after_an_eviction_is_predicted_over_what_comes_back():
    core = core_on(*cards())
    split_model(core, 30 * GiB)
    # 34 GiB: nothing is free enough now, and no card takes it whole even empty; once the
    # split model is gone (both its parts), the runtime splits the new one over both.
    d = demand("bigger", 34 * GiB, priority=P.PRODUCTION)
    placed = place(core, d, CARDS, 2.0, placing=Placing.RUNTIME, rule=RULE)
    assert [s.gpu for s in placed.shares] == [0, 1]
    assert sum(s.bytes for s in placed.shares) == 34 * GiB
    assert placed.shares[0].bytes == 34 * GiB * 24 // 40


def split_model(core: GateCore, nbytes: int = 30 * GiB, now: float = 1.0):
    """Place, submit and load a model the rule splits; returns the placement and leases."""
    d = demand("huge", nbytes)
    placement = place(core, d, CARDS, now, placing=Placing.RUNTIME, rule=RULE)
    assert placement.split
    leases = []
    for part in placement.demands(d):
        admission = core.submit(part, now)
        assert admission.lease is not None
        leases.append(admission.lease)
    for lease in leases:
        core.loaded(lease.id, now)
    for lease in leases:
        core.release(lease.id, now)
    return placement, leases


def test_a_split_load_is_a_part_per_card_in_proportion_to_free_memory():
    core = core_on(*cards())
    placement, leases = split_model(core)
    assert [lease.gpu for lease in leases] == [0, 1]
    assert not core.books.leases, "each part's lease ended with its request"
    assert [s.gpu for s in placement.shares] == [0, 1]
    assert sum(s.bytes for s in placement.shares) == 30 * GiB
    assert placement.shares[0].bytes == 30 * GiB * 24 // 40
    parts = core.books.parts_of(ResidentKey("ollama", "huge"))
    assert sorted((p.gpu, p.key.part, p.bytes) for p in parts) == [
        (0, 0, placement.shares[0].bytes),
        (1, 1, placement.shares[1].bytes),
    ]
    assert all(p.state is ResidentState.RESIDENT for p in parts)
    for g in CARDS:
        budget = core.budget(g)
        assert budget is not None and budget.schedulable >= 0
    # The next request rides on both parts, where they are.
    again = place(core, demand("huge", 30 * GiB), CARDS, 2.0, placing=Placing.RUNTIME, rule=RULE)
    assert [s.gpu for s in again.shares] == [0, 1] and not again.predicted


def test_evicting_one_part_unloads_the_model_on_every_card():
    core = core_on(*cards())
    placement, _ = split_model(core, 30 * GiB)
    parts = {p.gpu: p for p in core.books.parts_of(ResidentKey("ollama", "huge"))}
    # A production load on card 1 needs more than is free there: the part there goes, and
    # the runtime unloads the model whole, so card 0's part is unloading too.
    d = demand("urgent", 10 * GiB, priority=P.PRODUCTION, consumer="whisper", gpu_index=1)
    admission = core.submit(d, 2.0)
    unloads = [e for e in admission.effects if isinstance(e, Unload)]
    assert sorted(u.gpu for u in unloads) == [0, 1]
    assert sorted(u.bytes for u in unloads) == sorted(s.bytes for s in placement.shares)
    assert all(p.state is ResidentState.UNLOADING for p in parts.values())
    started = [e for e in admission.effects if isinstance(e, Event)]
    assert sum(e.kind is EventKind.EVICTION_STARTED for e in started) == 2
    # Each card confirms its own bytes back.
    for unload in unloads:
        core.unloaded(unload.key, 101.0, reclaimed=True)
    assert core.books.parts_of(ResidentKey("ollama", "huge")) == []


def test_a_listing_across_cards_keeps_parts_and_shares_the_reported_size():
    core = core_on(*cards())
    split_model(core, 30 * GiB)
    listed = ListedModel("huge", 32 * GiB, 32 * GiB, P.INTERACTIVE, KEEP_WARM, 900.0)
    effects = core.reconcile("ollama", CARDS, [listed], asked_at=5.0, now=5.0)
    parts = sorted(core.books.parts_of(ResidentKey("ollama", "huge")), key=lambda p: p.gpu)
    assert [p.gpu for p in parts] == [0, 1]
    assert sum(p.bytes for p in parts) == 32 * GiB
    assert parts[0].bytes > parts[1].bytes
    measured = [
        e for e in effects if isinstance(e, Event) and e.kind is EventKind.ENVELOPE_MEASURED
    ]
    assert len(measured) == 2
    # Not listed any more: both parts are gone.
    core.reconcile("ollama", CARDS, [], asked_at=6.0, now=6.0)
    assert core.books.parts_of(ResidentKey("ollama", "huge")) == []


def test_a_model_found_without_a_lease_is_put_where_its_memory_is():
    core = core_on(*cards())
    core.observe(host(*cards(used1=[proc(11, 5 * GiB, "ollama")]), at=2.0), 2.0)
    listed = ListedModel("oob", 5 * GiB, 5 * GiB, P.INTERACTIVE, KEEP_WARM, 900.0)
    core.reconcile("ollama", CARDS, [listed], asked_at=3.0, now=3.0)
    found = [r for r in core.residents() if r.key.model == "oob"]
    assert [r.gpu for r in found] == [1]


def test_parts_are_granted_in_card_order_and_the_grants_do_not_overcommit():
    core = core_on(*cards())
    d = demand("huge", 38 * GiB)
    placement = place(core, d, CARDS, 1.0, placing=Placing.RUNTIME, rule=RULE)
    parts = placement.demands(d)
    assert [p.gpu for p in parts] == [0, 1]
    assert [p.key.part for p in parts] == [0, 1]
    grants = []
    for part in parts:
        admission = core.submit(part, 1.0)
        grants.append(admission.lease)
        assert not any(isinstance(e, Grant) and e.lease.gpu != part.gpu for e in admission.effects)
    assert all(g is not None for g in grants)
    for g in CARDS:
        budget = core.budget(g)
        assert budget is not None and budget.schedulable >= 0


def test_a_part_is_not_served_by_the_whole_model_nor_the_whole_by_a_part():
    """A ticket placed as a split that finds the model loaded whole (another request placed
    it so while this one waited) must not take the whole one's place for 0 bytes: the books
    would hold a load nobody leased. The whole copy is replaced, as a copy with other
    options would be."""
    core = core_on(*cards())
    load(core, demand("model", 12 * GiB))
    part = demand("model", 6 * GiB, gpu_index=0)
    part = attrs.evolve(part, key=part.key.on(0))
    admission = core.submit(part, 2.0)
    assert admission.lease is None or admission.lease.pending > 0
    leased = {lease.key for lease in core.books.leases.values() if lease.pending}
    for resident in core.residents():
        assert resident.state is not ResidentState.LOADING or resident.key in leased


def test_a_ticket_queued_on_one_card_rides_on_its_model_loading_on_another():
    """Two requests for one model placed on different cards (free memory moved between
    them): the runtime loads it once, so the second rides on the first's load."""
    core = core_on(*cards())
    first = core.submit(demand("model", 8 * GiB, gpu_index=1), 1.0)
    assert first.lease is not None and first.lease.pending == 8 * GiB
    second = core.submit(demand("model", 8 * GiB, gpu_index=0), 1.0)
    assert second.lease is None and second.failure is None  # it waits, adds nothing
    assert core.budget(0).schedulable == BIG  # nothing leased for it on card 0
    (waiting,) = queue_view(core, 1.0)
    assert (waiting.wait.reason, waiting.wait.holder) == (WaitReason.SAME_MODEL, first.lease.key)
    assert (
        waiting.wait.line == "its model ollama/model is loading on GPU 1: it is served once loaded"
    )
    granted = core.loaded(first.lease.id, 2.0) + core.observe(host(*cards(), at=2.5), 2.5)
    grants = [e for e in granted if isinstance(e, Grant) and e.ticket_id == second.ticket_id]
    assert len(grants) == 1 and grants[0].lease.pending == 0
    core.release(first.lease.id, 3.0)
    core.release(grants[0].lease.id, 3.0)
    (resident,) = core.residents()
    assert (resident.gpu, resident.in_flight, resident.state) == (1, 0, ResidentState.RESIDENT)
    assert not core.books.leases
