"""What operators did that still holds: GPUs paused, consumers draining, since when and
by whom, for the status document, the dashboard and the metrics. The core holds all of it
(`GateCore.paused`, `GateCore.draining`, `GateCore.operator_mark`); this only words it.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from gpugate.core.operator import Mark

if TYPE_CHECKING:
    from gpugate.gate.gate import Gate

UNDO_PAUSE = "gpugate resume --gpu {gpu}"
UNDO_DRAIN = "gpugate undrain {consumer}"


def _when(mark: Mark | None, now: float) -> tuple[float | None, float | None]:
    """(wall-clock time, seconds ago) of a mark; (None, None) when unknown."""
    if mark is None:
        return None, None
    ago = max(0.0, now - mark.since)
    return round(time.time() - ago, 3), round(ago, 3)


def paused_seconds(gate: Gate, gpu: int) -> float | None:
    """Seconds the GPU has been paused for (None: not paused, or since when is unknown)."""
    if gpu not in gate.core.operator.paused():
        return None
    mark = gate.core.operator.mark(gpu)
    return None if mark is None else max(0.0, gate.clock() - mark.since)


def pause_fields(gate: Gate, gpu: int) -> dict[str, Any]:
    """A GPU's pause, for its entry in the status document."""
    if gpu not in gate.core.operator.paused():
        return {
            "paused": False,
            "paused_since": None,
            "paused_seconds": None,
            "paused_by": None,
            "undo": None,
        }
    mark = gate.core.operator.mark(gpu)
    since, seconds = _when(mark, gate.clock())
    return {
        "paused": True,
        "paused_since": since,
        "paused_seconds": seconds,
        "paused_by": None if mark is None else mark.by,
        "undo": UNDO_PAUSE.format(gpu=gpu),
    }


def consumer_document(gate: Gate, name: str) -> dict[str, Any]:
    """A consumer's operator state: draining, and drained once it holds no lease."""
    draining, drained = gate.core.operator.draining(name)
    leases = sum(1 for lease in gate.core.leases() if lease.key.consumer == name)
    configured = next((c for c in gate.config.consumers if c.name == name), None)
    document: dict[str, Any] = {
        "consumer": name,
        "gpu": None if configured is None else configured.cards[0],
        "gpus": None if configured is None else list(configured.cards),
        "draining": draining,
        "drained": drained,
        "leases": leases,
        "draining_since": None,
        "draining_seconds": None,
        "draining_by": None,
        "undo": None,
        "lifecycle": lifecycle_document(gate, name),
    }
    if draining:
        mark = gate.core.operator.mark(name)
        since, seconds = _when(mark, gate.clock())
        document.update(
            draining_since=since,
            draining_seconds=seconds,
            draining_by=None if mark is None else mark.by,
            undo=UNDO_DRAIN.format(consumer=name),
        )
    return document


def lifecycle_document(gate: Gate, name: str) -> dict[str, Any] | None:
    """A runtime's lifecycle (stopped, starting, up, asleep, stopping) and since when; None
    for a runtime without one (its models come and go, the runtime stays)."""
    life = gate.core.lifecycle(name)
    if life is None:
        return None
    ago = max(0.0, gate.clock() - life.since)
    return {
        "state": life.state.value,
        "since": round(time.time() - ago, 3),
        "seconds": round(ago, 3),
        "failures": life.backoff.failures,
    }


def consumer_documents(gate: Gate) -> list[dict[str, Any]]:
    """Every configured consumer's operator state, in the configuration's order."""
    return [consumer_document(gate, c.name) for c in gate.config.consumers]
