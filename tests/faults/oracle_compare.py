"""The simulated Ollama's reading of each request against the Go oracle's.

The oracle (tests/oracle/) sits between the gate and the simulated Ollama and records how
Ollama v0.24.0 reads each request; the simulated Ollama records how it read the same bytes
(HOST.yaml `ollama.record`, gpugate.sim.ollama.record). They are independent: the oracle is
Go's own net/http and encoding/json, the simulator its Python copy. For each request both
saw, these must agree: whether it reaches the scheduler (could load a model), and then the
model, keep_alive and runner options it asks for and the 500 it gets once the model has
loaded; else whether its body failed to decode.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import attrs

from tests.oracle.oracle import Record

SIMULATED = frozenset(
    {
        "/api/generate",
        "/api/chat",
        "/api/embed",
        "/api/embeddings",
        "/v1/chat/completions",
        "/v1/completions",
        "/v1/embeddings",
        "/v1/audio/transcriptions",
    }
)
"""The routes that load which the simulated Ollama serves (not /v1/responses, /v1/messages)."""


@attrs.frozen
class SimReading:
    """One line of the simulated Ollama's record (gpugate.sim.ollama.record.Reading)."""

    t: float
    case: str
    path: str
    loads: bool = False
    model: str = ""
    keep_alive: int | None = None
    runner: dict[str, int | bool] = attrs.field(factory=dict)
    malformed: bool = False
    after_load: str = ""
    status: int = 0


NOT_READ = SimReading(0.0, "", "")
"""A request the simulated Ollama refused before its handler read it (Host, CORS, method)."""


def read_readings(path: Path) -> dict[str, SimReading]:
    """The simulated Ollama's readings by case (whole lines only)."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return {}
    found = {}
    for line in text.split("\n")[:-1]:
        if line:
            reading = SimReading(**json.loads(line))
            if reading.case:
                found[reading.case] = reading
    return found


@attrs.define
class Comparison:
    compared: int = 0
    loads: int = 0
    """Of those compared, read as loads by both."""
    refused_after_load: int = 0
    """Of the loads, refused once loaded (a template or format) by both."""
    malformed: int = 0
    """Of the refusals, a body both found undecodable."""
    disagreements: list[str] = attrs.field(factory=list)
    unsimulated: Counter[str] = attrs.field(factory=Counter)
    """Requests on a loading route the simulator does not serve, by route (not compared)."""


def _said(
    loads: bool, model: str, keep_alive: int | None, runner: dict[str, int | bool], after: str
) -> str:
    if not loads:
        return "refused"
    options = dict(sorted(runner.items()))
    return f"loads {model} keep_alive={keep_alive} runner={options} after_load={after!r}"


def compare_one(record: Record, sim: SimReading) -> str | None:
    """How the two readings of one request differ; None when they agree."""
    runner = record.runner or {}
    oracle = _said(record.could_load, record.model, record.keep_alive, runner, record.after_load)
    mine = _said(sim.loads, sim.model, sim.keep_alive, sim.runner, sim.after_load)
    if oracle != mine:
        return f"oracle: {oracle} ({record.reason}); simulator: {mine} ({sim.status})"
    if not record.could_load and record.malformed != sim.malformed:
        return (
            f"oracle: malformed={record.malformed} ({record.reason}); "
            f"simulator: malformed={sim.malformed} ({sim.status})"
        )
    return None


def compare(records: list[Record], readings: dict[str, SimReading]) -> Comparison:
    """Every oracle record of a fuzzer case on a simulated loading route, against the
    simulator's reading of it."""
    result = Comparison()
    for record in records:
        if not record.case or record.undecided:
            continue
        if record.path not in SIMULATED:
            if record.could_load:
                result.unsimulated[record.path] += 1
            continue
        sim = readings.get(record.case, NOT_READ)
        result.compared += 1
        difference = compare_one(record, sim)
        if difference is not None:
            result.disagreements.append(f"case {record.case} {record.path}: {difference}")
            continue
        if record.could_load:
            result.loads += 1
            result.refused_after_load += bool(record.after_load)
        else:
            result.malformed += record.malformed
    return result
