"""What the agent-check responder says (HAProxy's one line): a state and a weight, from the
numbers capacity computes (gpugate.control.capacity; the states are its module's docstring's).
"""

from __future__ import annotations

from typing import Any

import attrs

from gpugate.core.capacity import Assessment, Verdict
from gpugate.core.units import MiB

FLOOR = 256 * MiB
"""A host with less than this schedulable on every GPU is drained (nothing worth routing)."""
FIT_WEIGHT_MAX = 99
"""The most a model that only fits may weigh: 100 % is kept for one that is resident."""


@attrs.frozen
class Answer:
    """What the agent says: a state and a weight, and why."""

    state: str
    """`up`, `drain` or `maint`."""
    weight: int
    """Percent of the server's configured weight."""
    reason: str

    @property
    def line(self) -> str:
        if self.state == "up":
            return f"up ready {self.weight}%"
        return f"{self.state} 0%"


def rank(answer: Answer) -> tuple[int, int]:
    return ({"up": 2, "drain": 1}.get(answer.state, 0), answer.weight)


def unhealthy(failed: tuple[str, ...]) -> Answer:
    return Answer("maint", 0, "unhealthy: " + (", ".join(failed) or "not started"))


def host_answer(ok: bool, failed: tuple[str, ...], gpus: list[dict[str, Any]]) -> Answer:
    if not ok:
        return unhealthy(failed)
    usable = [g for g in gpus if not g["paused"]]
    if not usable:
        return Answer("drain", 0, "every GPU is paused")
    best = max(g["schedulable"] for g in usable)
    if best < FLOOR:
        return Answer("drain", 0, f"no GPU has {FLOOR // MiB} MiB schedulable")
    total = sum(g["total"] for g in gpus)
    # The queue goes first: what its demands will take is no new request's.
    free = sum(max(0, g["schedulable"] - g.get("queued_bytes", 0)) for g in usable)
    depth = sum(g.get("queue_depth", 0) for g in gpus)
    reason = "schedulable share of the memory"
    if depth:
        reason += f", less what the {depth} waiting demand(s) will take"
    return Answer("up", percent(free, total, 100), reason)


def model_answer(
    ok: bool, failed: tuple[str, ...], assessment: Assessment, total: int | None
) -> Answer:
    if not ok:
        return unhealthy(failed)
    verdict = assessment.verdict
    if verdict is Verdict.RESIDENT:
        return Answer("up", 100, assessment.reason)
    available = assessment.available
    if verdict is Verdict.FITS and available is not None and total:
        left = available - assessment.needed
        return Answer("up", percent(left, total, FIT_WEIGHT_MAX), "fits")
    if verdict is Verdict.UNKNOWN and available is not None and total and available >= FLOOR:
        return Answer("up", percent(available, total, FIT_WEIGHT_MAX), "no envelope known")
    reason = verdict.value
    if assessment.blocked is not None:
        reason = f"{reason}: {assessment.blocked.value}"
    elif assessment.reason:
        reason = f"{reason}: {assessment.reason}"
    return Answer("drain", 0, reason)


def percent(part: int, total: int, ceiling: int) -> int:
    if total <= 0:
        return 1
    return max(1, min(ceiling, round(100 * part / total)))
