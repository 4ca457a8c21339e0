"""The trace's overrun count: which of the gate's logged overruns a correction followed."""

from __future__ import annotations

from collections import Counter

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client import Counter as PromCounter

from tests.faults.trace_hosts import INCIDENT, TWO
from tests.faults.trace_overruns import overrun_rows, overruns, overruns_in


def overrun(gpu: int, model: str | None = "qwen2.5:7b", consumer: str = "ollama") -> dict:
    event = {"event": "overrun", "consumer": consumer, "gpu": gpu, "bytes": 300 << 20}
    return event if model is None else {**event, "model": model}


def measured(gpu: int, model: str = "qwen2.5:7b", consumer: str = "ollama") -> dict:
    return {"event": "envelope_measured", "consumer": consumer, "model": model, "gpu": gpu}


def test_an_overrun_the_books_then_took_the_runtimes_figure_for_is_corrected():
    counted = overruns(Counter({0: 1}), [overrun(0), {"event": "failure"}, measured(0)])
    assert counted.seen == Counter({0: 1})
    assert counted.corrected == Counter({0: 1})
    assert counted.scraped == Counter({0: 1})


def test_a_correction_before_it_or_of_another_model_card_or_consumer_is_not_its_own():
    events = [
        measured(0),
        overrun(0),
        measured(1),
        measured(0, model="gemma3:12b"),
        measured(0, consumer="comfyui"),
    ]
    assert overruns(Counter({0: 1}), events).corrected == Counter()


def test_an_overrun_no_model_could_be_named_for_is_corrected_by_any_of_its_consumers():
    events = [overrun(1, model=None), measured(1, model="gemma3:27b")]
    assert overruns(Counter({1: 1}), events).corrected == Counter({1: 1})


def test_the_rows_show_each_card_on_two_and_metrics_only_when_they_disagree():
    counted = overruns(Counter({0: 1}), [overrun(0), measured(0), overrun(1), overrun(1)])
    rows = overrun_rows(counted, TWO)
    assert [r.split()[-1] for r in rows] == ["3", "1", "2", "1", "1", "0", "1"]
    assert "/metrics" in rows[-1]
    single = overrun_rows(overruns(Counter(), []), INCIDENT)
    assert [r.split()[-1] for r in single] == ["0", "0"]


def test_metrics_count_per_card_over_consumers():
    registry = CollectorRegistry()
    counter = PromCounter("gpugate_overruns", "overruns", ["consumer", "gpu"], registry=registry)
    counter.labels("ollama", "0").inc(2)
    counter.labels("comfyui", "0").inc()
    counter.labels("ollama", "1").inc()
    assert overruns_in(generate_latest(registry).decode()) == Counter({0: 3, 1: 1})
    assert overruns_in("") == Counter()


def test_a_traceback_on_the_gates_stderr_is_counted_whole():
    from tests.faults.trace import tracebacks

    lines = [
        "Error handling request",
        "Traceback (most recent call last):",
        '  File "x.py", line 1, in f',
        "    g()",
        "KeyError: 'lease'",
        "gpugate: draining",
    ]
    assert tracebacks(lines) == ["\n".join(lines[1:5])]
    assert tracebacks(["gpugate: ready"]) == []
