"""The swap-aware queue, case by case (gpugate.core.swaps): a loaded model's requests go
ahead of an earlier request that would evict it, up to the bound; a higher-class idle model
yields after `yield_after`; a model evicted and loaded again within the window is a swap."""

from __future__ import annotations

from gpugate.core.classes import PriorityClass
from gpugate.core.effects import Event, EventKind, Grant, Unload
from gpugate.core.failures import FailureClass
from gpugate.core.planner import PlannerSettings
from gpugate.core.units import GiB
from tests.core.builders import demand, gpu, host, make_core, proc

P = PriorityClass


class Card:
    """One 16 GiB card where two 8 GiB models cannot be resident together."""

    def __init__(self, planner: PlannerSettings) -> None:
        self.core = make_core(max_wait=120.0, planner=planner)
        self.loaded: dict[str, int] = {}
        self.effects: list = []
        self.sample(0.0)

    def sample(self, now: float) -> None:
        runners = [proc(10 + i, n, "ollama") for i, n in enumerate(self.loaded.values())]
        self.effects += self.core.observe(host(gpu(*runners), at=now), now)

    def ask(self, model: str, now: float, klass: P = P.INTERACTIVE, resident: P | None = None):
        self.sample(now)
        admission = self.core.submit(
            demand(model, 8 * GiB, priority=klass, resident_priority=resident or klass), now
        )
        self.effects += admission.effects
        return admission

    def load(self, lease_id: int, model: str, now: float) -> None:
        self.loaded[model] = 8 * GiB
        self.sample(now)
        self.effects += self.core.loaded(lease_id, now)

    def unload_all(self, now: float) -> None:
        for unload in [e for e in self.effects if isinstance(e, Unload)]:
            self.loaded.pop(unload.key.model, None)
            self.sample(now)
            self.effects += self.core.unloaded(unload.key, now, reclaimed=True)
            self.effects.remove(unload)

    def a_evicted_for_b(self) -> None:
        """a loaded at 0 and idle from 1; b asked at 2 evicts it, loads at 3 and is idle
        from 4 (the first half of a swap: a asked again would be its second)."""
        a1 = self.ask("a", 0.0)
        self.load(a1.lease.id, "a", 0.0)
        self.effects += self.core.release(a1.lease.id, 1.0)
        b1 = self.ask("b", 2.0)
        self.unload_all(3.0)
        self.load(self.granted(b1.ticket_id).id, "b", 3.0)
        self.effects += self.core.release(b1.ticket_id, 4.0)

    def ticket(self, ticket_id: int):
        return next(t for t in self.core.waiting(0) if t.id == ticket_id)

    def granted(self, ticket_id: int):
        grants = [e.lease for e in self.effects if isinstance(e, Grant)]
        return next(lease for lease in grants if lease.id == ticket_id)


def test_requests_for_the_loaded_model_go_ahead_until_the_bound_of_overtakes():
    card = Card(PlannerSettings(equal_class_grace=5.0, swap_hold=100.0, swap_overtakes=2))
    a1 = card.ask("a", 0.0)
    card.load(a1.lease.id, "a", 0.0)
    b1 = card.ask("b", 1.0)
    assert b1.waiting
    a2, a3 = card.ask("a", 2.0), card.ask("a", 3.0)
    assert a2.lease is not None and a2.lease.pending == 0
    assert a3.lease is not None and a3.lease.pending == 0
    assert card.ticket(b1.ticket_id).overtaken == 2
    a4 = card.ask("a", 4.0)
    assert a4.waiting, "a third overtake of b past swap_overtakes"
    assert card.ticket(b1.ticket_id).overtaken == 2


def test_a_request_waiting_past_swap_hold_is_overtaken_no_more():
    card = Card(PlannerSettings(equal_class_grace=5.0, swap_hold=10.0, swap_overtakes=100))
    a1 = card.ask("a", 0.0)
    card.load(a1.lease.id, "a", 0.0)
    b1 = card.ask("b", 1.0)
    assert card.ask("a", 10.9).lease is not None
    late = card.ask("a", 11.0)
    assert late.waiting
    assert card.ticket(b1.ticket_id).overtaken == 1


def test_first_come_first_served_lets_nobody_overtake():
    card = Card(PlannerSettings(equal_class_grace=5.0, swap_overtakes=0))
    a1 = card.ask("a", 0.0)
    card.load(a1.lease.id, "a", 0.0)
    b1 = card.ask("b", 1.0)
    a2 = card.ask("a", 2.0)
    assert a2.waiting and card.ticket(b1.ticket_id).overtaken == 0


def test_a_higher_class_is_never_held_back_by_the_bound():
    card = Card(PlannerSettings(equal_class_grace=5.0, swap_overtakes=0))
    a1 = card.ask("a", 0.0)
    card.load(a1.lease.id, "a", 0.0)
    card.ask("b", 1.0)
    urgent = card.ask("a", 2.0, klass=P.PRODUCTION, resident=P.INTERACTIVE)
    assert urgent.lease is not None and urgent.lease.pending == 0


def test_a_model_evicted_and_loaded_again_within_the_window_is_a_swap():
    card = Card(PlannerSettings(equal_class_grace=0.0, swap_overtakes=0, swap_window=300.0))
    a1 = card.ask("a", 0.0)
    card.load(a1.lease.id, "a", 0.0)
    card.effects += card.core.release(a1.lease.id, 1.0)
    b1 = card.ask("b", 2.0)
    assert [e.key.model for e in card.effects if isinstance(e, Unload)] == ["a"]
    card.unload_all(3.0)
    card.load(card.granted(b1.ticket_id).id, "b", 3.0)
    card.effects += card.core.release(b1.ticket_id, 4.0)
    a2 = card.ask("a", 5.0)
    card.unload_all(6.0)
    card.granted(a2.ticket_id)
    swaps = [e for e in card.effects if isinstance(e, Event) and e.kind is EventKind.SWAP]
    assert [(e.model, e.gpu, e.wait) for e in swaps] == [("a", 0, 4.0)]


def test_no_swap_after_the_window():
    card = Card(PlannerSettings(equal_class_grace=0.0, swap_overtakes=0, swap_window=10.0))
    card.a_evicted_for_b()
    card.ask("a", 20.0)
    card.unload_all(21.0)
    assert not [e for e in card.effects if isinstance(e, Event) and e.kind is EventKind.SWAP]


def test_an_idle_higher_class_model_yields_to_a_lower_class_demand_after_yield_after():
    card = Card(PlannerSettings(yield_after=30.0))
    a1 = card.ask("a", 0.0)
    card.load(a1.lease.id, "a", 0.0)
    card.effects += card.core.release(a1.lease.id, 1.0)
    b1 = card.ask("b", 2.0, klass=P.BACKGROUND)
    assert b1.waiting and not [e for e in card.effects if isinstance(e, Unload)]
    assert "ollama/a (interactive) yields to it once idle 30s (yield_after): in 29s" in (
        card.ticket(b1.ticket_id).reason
    )
    card.sample(31.0)
    card.effects += card.core.tick(31.0)
    assert [e.key.model for e in card.effects if isinstance(e, Unload)] == ["a"]
    started = [
        e for e in card.effects if isinstance(e, Event) and e.kind is EventKind.EVICTION_STARTED
    ]
    assert "idle past yield_after (30s)" in started[-1].detail


def test_without_yield_after_a_lower_class_demand_cannot_outwait_a_higher_class_ttl():
    card = Card(PlannerSettings(yield_after=None))
    a1 = card.ask("a", 0.0)
    card.load(a1.lease.id, "a", 0.0)
    card.effects += card.core.release(a1.lease.id, 1.0)
    b1 = card.ask("b", 2.0, klass=P.BACKGROUND)
    assert b1.failure is not None
    assert b1.failure.failure_class is FailureClass.DEADLINE_CANNOT_BE_MET
    assert not [e for e in card.effects if isinstance(e, Unload)]
    assert [r.key.model for r in card.core.residents(0)] == ["a"]
