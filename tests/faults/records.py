"""Reading what the simulated runtimes acted on (HOST.yaml `record:`), for the fuzzer's oracle.

The simulated ComfyUI writes a line per `POST /prompt` answer (gpugate_sim.comfyui.record),
the simulated whisper-server one per `/load` and `/inference` answer
(gpugate_sim.whisper.record). Each request the fuzzer sends carries `?case=<id>`, which the
line repeats, so an oracle can tell which of its cases reached a runtime and loaded a model.
"""

from __future__ import annotations

import enum
import json
from pathlib import Path
from typing import Any

import attrs


@attrs.frozen
class PromptRecord:
    """One `POST /prompt` the simulated ComfyUI answered."""

    t: float
    """time.time() when its handler started."""
    case: str
    status: int
    queued: bool
    """The prompt went on the queue: the only way it can load a model."""
    prompt_id: str | None


class WhisperRoute(enum.Enum):
    LOAD = "load"
    INFERENCE = "inference"


@attrs.frozen
class WhisperRecord:
    """One `/load` or `/inference` the simulated whisper-server took."""

    t: float
    case: str
    status: int | None
    """None: no answer, the server exited (a /load whose model did not fit)."""
    route: WhisperRoute
    model: str | None = None
    """/load: the model asked for (None without a `model` field)."""
    loaded: bool = False
    """/load: the server switched to that model."""


def _lines(path: Path) -> list[dict[str, Any]]:
    """Whole lines only: a line still being written (no newline yet) is left for later."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return []
    return [json.loads(line) for line in text.split("\n")[:-1] if line]


def read_prompt_records(path: str | Path) -> list[PromptRecord]:
    """The records in a `comfyui.record` file, in the order they were written."""
    return [
        PromptRecord(
            t=float(line["t"]),
            case=str(line["case"]),
            status=int(line["status"]),
            queued=bool(line["queued"]),
            prompt_id=line["prompt_id"],
        )
        for line in _lines(Path(path))
    ]


def read_whisper_records(path: str | Path) -> list[WhisperRecord]:
    """The records in a `whisper.record` file, in the order they were written."""
    records = []
    for line in _lines(Path(path)):
        # A /load line is the one that names the model it was asked for (maybe null).
        load = "model" in line
        records.append(
            WhisperRecord(
                t=float(line["t"]),
                case=str(line["case"]),
                status=None if line["status"] is None else int(line["status"]),
                route=WhisperRoute.LOAD if load else WhisperRoute.INFERENCE,
                model=line.get("model"),
                loaded=bool(line.get("loaded", False)),
            )
        )
    return records
