"""A swap the core records (a model evicted for a request, then loaded again within
`swap_window`) reaches `gpugate_swaps_total{consumer,gpu}` through the gate's event hub."""

from __future__ import annotations

import types

from gpugate.control.metrics import GateMetrics
from gpugate.core.effects import Event, EventKind, Unload
from gpugate.core.planner import PlannerSettings
from gpugate.gate.events import EventHub
from tests.core.test_swaps import Card


def swaps_counted(metrics: GateMetrics) -> dict[tuple[str, str], float]:
    return {
        (s.labels["consumer"], s.labels["gpu"]): s.value
        for f in metrics.swaps.collect()
        for s in f.samples
        if s.name == "gpugate_swaps_total"
    }


def test_a_model_loaded_again_after_its_eviction_counts_one_swap():
    hub = EventHub()
    metrics = GateMetrics(types.SimpleNamespace(events=hub))  # type: ignore[arg-type]
    card = Card(PlannerSettings(equal_class_grace=0.0, swap_overtakes=0))
    card.a_evicted_for_b()
    card.ask("a", 5.0)
    card.unload_all(6.0)
    for effect in card.effects:
        if isinstance(effect, Event):
            hub.publish(effect)
    assert not [e for e in card.effects if isinstance(e, Unload)]
    assert [e.kind for e in hub.recent()].count(EventKind.SWAP) == 1
    # b was evicted for a, but not loaded again: only a's return is a swap.
    assert swaps_counted(metrics) == {("ollama", "0"): 1.0}
