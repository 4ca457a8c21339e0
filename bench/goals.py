"""The targets `make bench` holds the gate to, each a row: what was measured, the target,
and whether it was met.

The figures come from the run's own tables: the request-rate and stream rows (the gate
against the bare pass-through, nginx and direct, on the Python upstream, bench/__main__),
the simulated runtimes' paths (bench/runtimes.py) and the real ones' (bench/real.py).
Ratios are of figures measured in the same run.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping

import attrs

from bench.targets import CEILING, DIRECT, FLOOR

GATES = ("gpugate (asyncio)", "gpugate (uvloop)")


class Sense(enum.Enum):
    """Which side of the target a measured value must be on."""

    AT_MOST = "≤"
    AT_LEAST = "≥"


@attrs.frozen
class Goal:
    """One target and what was measured for it (None: not measured in this run)."""

    what: str
    measured: float | None
    sense: Sense
    target: float
    unit: str

    @property
    def met(self) -> bool | None:
        if self.measured is None:
            return None
        if self.sense is Sense.AT_MOST:
            return self.measured <= self.target
        return self.measured >= self.target

    def row(self) -> str:
        value = "not measured" if self.measured is None else self._format(self.measured)
        verdict = {True: "met", False: "missed", None: "—"}[self.met]
        target = f"{self.sense.value} {self._format(self.target)}"
        return f"| {self.what} | {value} | {target} | {verdict} |"

    def _format(self, value: float) -> str:
        if self.unit == "x":
            return f"{value:.2f}x"
        if self.unit == "ms added":
            return f"{value:+.2f} ms"
        return f"{value:.2f} {self.unit}"


def _added(cases: Iterable[Mapping[str, object]], runtime: str, route: str) -> float | None:
    """The gate's added p50 for one case of a runtimes table, if it was measured."""
    for result in cases:
        case = result["case"]
        if case["runtime"] == runtime and case["route"] == route:  # type: ignore[index]
            return float(result["gate"]["added_p50_ms"])  # type: ignore[index]
    return None


def goals(
    results: Mapping[str, Mapping[str, Mapping[str, float]]],
    simulated: Iterable[Mapping[str, object]],
    real: Iterable[Mapping[str, object]],
    connections: Iterable[int],
) -> list[Goal]:
    """Every target of the run, in the order docs/benchmarks.md lists them."""
    simulated, real = list(simulated), list(real)
    ms = "ms added"
    found = [
        Goal("First token, real llama-server (`POST /completion`, streamed), p50",
             _added(real, "llama-server (real)", "POST /completion, streamed, first token"),
             Sense.AT_MOST, 0.3, ms),
        Goal("First token, simulated Ollama (`POST /api/generate`), p50",
             _added(simulated, "Ollama", "POST /api/generate, first token"),
             Sense.AT_MOST, 0.3, ms),
        Goal("ComfyUI `POST /prompt`, FLUX graph read and validated (simulated ComfyUI), p50",
             _added(simulated, "ComfyUI", "POST /prompt (FLUX)"), Sense.AT_MOST, 1.0, ms),
        Goal("Real whisper-server `GET /health`, per request (p50)",
             _added(real, "whisper-server (real)", "GET /health"), Sense.AT_MOST, 1.0, ms),
        Goal("Real whisper-server `POST /inference` (0.2 s clip), per request (p50)",
             _added(real, "whisper-server (real)", "POST /inference, 0.2 s clip"),
             Sense.AT_MOST, 1.0, ms),
    ]  # fmt: skip
    for gate in (name for name in GATES if name in results):
        for conns in connections:
            key = f"c{conns}"
            row, floor = results[gate].get(key), results.get(FLOOR, {}).get(key)
            ceiling = results.get(CEILING, {}).get(key)
            where = f"{gate}, Python upstream, {conns} connection(s)"
            found.append(
                Goal(
                    f"Rate vs the bare relay, {where}",
                    _ratio(row, floor, "rps"),
                    Sense.AT_LEAST,
                    1.5,
                    "x",
                )
            )
            found.append(
                Goal(
                    f"CPU per request vs the bare relay's, {where}",
                    _ratio(row, floor, "cpu_us"),
                    Sense.AT_MOST,
                    0.6,
                    "x",
                )
            )
            found.append(Goal(f"Rate vs nginx, {where}",
                              _ratio(row, ceiling, "rps"), Sense.AT_LEAST, 1.0, "x"))  # fmt: skip
        streams, direct = results[gate].get("streams"), results.get(DIRECT, {}).get("streams")
        ttfb = None
        if streams is not None and direct is not None:
            ttfb = streams["ttfb_p99_ms"] - direct["ttfb_p99_ms"]
        found.append(
            Goal(f"Stream TTFB p99 over direct, 64 streams, {gate}", ttfb, Sense.AT_MOST, 2.0, ms)
        )
    found.append(
        Goal("Rate vs the bare relay, static upstream (no static upstream in this run)",
             None, Sense.AT_LEAST, 1.5, "x")
    )  # fmt: skip
    return found


def _ratio(
    row: Mapping[str, float] | None, reference: Mapping[str, float] | None, key: str
) -> float | None:
    if row is None or reference is None or not reference.get(key):
        return None
    return row[key] / reference[key]


def table(found: list[Goal]) -> list[str]:
    """The section's lines for docs/benchmarks.md."""
    met = sum(goal.met is True for goal in found)
    measured = sum(goal.met is not None for goal in found)
    return [
        "",
        f"The targets, from this run's tables: {met} of {measured} measured met.",
        "",
        "| target | measured | goal | met |",
        "|---|---:|---:|---|",
        *(goal.row() for goal in found),
    ]
