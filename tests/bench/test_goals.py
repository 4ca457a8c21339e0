"""The targets' rows: each says what was measured against its target, met or missed, from
the run's own tables; what a run did not measure is said so, never counted met."""

from __future__ import annotations

import pytest

from bench.goals import Goal, Sense, goals, table


def case(runtime: str, route: str, added: float) -> dict[str, object]:
    return {"case": {"runtime": runtime, "route": route}, "gate": {"added_p50_ms": added}}


RESULTS = {
    "direct": {"c1": {"rps": 9000.0, "cpu_us": 0.0}, "streams": {"ttfb_p99_ms": 3.0}},
    "bare pass-through (asyncio)": {"c1": {"rps": 1000.0, "cpu_us": 300.0}},
    "nginx": {"c1": {"rps": 2000.0, "cpu_us": 80.0}},
    "gpugate (asyncio)": {
        "c1": {"rps": 2100.0, "cpu_us": 150.0},
        "streams": {"ttfb_p99_ms": 5.5},
    },
}
SIMULATED = [
    case("Ollama", "POST /api/generate, first token", 0.45),
    case("ComfyUI", "POST /prompt (FLUX)", 0.7),
]
REAL = [
    case("llama-server (real)", "POST /completion, streamed, first token", 0.25),
    case("whisper-server (real)", "GET /health", 0.4),
    case("whisper-server (real)", "POST /inference, 0.2 s clip", 1.2),
]


def by_name(found: list[Goal]) -> dict[str, Goal]:
    return {goal.what: goal for goal in found}


def test_each_target_is_judged_on_the_runs_figures():
    found = by_name(goals(RESULTS, SIMULATED, REAL, [1]))
    where = "gpugate (asyncio), Python upstream, 1 connection(s)"
    expected = {
        "First token, real llama-server (`POST /completion`, streamed), p50": (0.25, True),
        "First token, simulated Ollama (`POST /api/generate`), p50": (0.45, False),
        "ComfyUI `POST /prompt`, FLUX graph read and validated (simulated ComfyUI), p50": (
            0.7,
            True,
        ),
        "Real whisper-server `GET /health`, per request (p50)": (0.4, True),
        "Real whisper-server `POST /inference` (0.2 s clip), per request (p50)": (1.2, False),
        f"Rate vs the bare relay, {where}": (2.1, True),
        f"CPU per request vs the bare relay's, {where}": (0.5, True),
        f"Rate vs nginx, {where}": (1.05, True),
        "Stream TTFB p99 over direct, 64 streams, gpugate (asyncio)": (2.5, False),
    }
    for what, (measured, met) in expected.items():
        goal = found[what]
        assert goal.measured == pytest.approx(measured) and goal.met is met, what


def test_a_target_not_measured_is_neither_met_nor_missed():
    found = goals(RESULTS, [], [], [1])
    absent = [goal for goal in found if goal.measured is None]
    assert {goal.met for goal in absent} == {None}
    assert any("static upstream" in goal.what for goal in absent)
    assert "Ollama" in " ".join(goal.what for goal in absent)  # no simulated runtimes ran
    lines = table(found)
    assert "| not measured |" in "\n".join(lines)
    assert lines[1] == "The targets, from this run's tables: 3 of 4 measured met."


def test_a_row_prints_the_value_the_target_and_the_verdict():
    goal = Goal("CPU", 0.7, Sense.AT_MOST, 0.6, "x")
    assert goal.row() == "| CPU | 0.70x | ≤ 0.60x | missed |"
    goal = Goal("First token", 0.21, Sense.AT_MOST, 0.3, "ms added")
    assert goal.row() == "| First token | +0.21 ms | ≤ +0.30 ms | met |"
