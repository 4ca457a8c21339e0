"""The swap benchmark's workloads on the decision core: short runs of both, checked for
what the benchmark's figures rest on (every request answered, swaps counted from the
core's events), and the issue's figure on the full alternation."""

from __future__ import annotations

import attrs

from bench import alternation
from bench.alternation import Figures, alternating, met, seeded, settings


def test_both_queues_answer_every_request_of_a_short_alternation(monkeypatch) -> None:
    monkeypatch.setattr(alternation, "REQUESTS", 80)
    for fifo in (True, False):
        figures = alternating(settings(fifo))
        assert figures.requests == 80
        assert figures.granted + figures.refused == 80
        # A and B cannot be resident together: every load after the first two swaps one.
        assert figures.swaps <= figures.loads <= figures.swaps + 2


def test_first_come_first_served_swaps_more_than_the_gates_queue_under_alternation() -> None:
    fifo, gate = alternating(settings(True)), alternating(settings(False))
    assert met({"alternating": {"fifo": fifo, "gate": gate}}), (fifo, gate)


def test_the_seeded_trace_is_the_same_every_time(monkeypatch) -> None:
    monkeypatch.setattr(alternation, "REQUESTS", 80)
    assert seeded(settings(False)) == seeded(settings(False))


def test_the_figure_is_not_met_by_more_swaps_or_a_worse_p99() -> None:
    fifo = Figures(1000, 1000, 0, 100, 102, 1.0, 10.0, 500.0)
    assert met({"w": {"fifo": fifo, "gate": attrs.evolve(fifo, swaps=50)}})
    assert not met({"w": {"fifo": fifo, "gate": attrs.evolve(fifo, swaps=51)}})
    assert not met({"w": {"fifo": fifo, "gate": attrs.evolve(fifo, swaps=10, p99=10.5)}})
