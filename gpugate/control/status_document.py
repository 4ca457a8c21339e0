"""The status document's shape, shared by its two makers: the gate's `/gate/v1/status`
(`control/app.py`, from its books) and `gpugate status` with no gate running (the
command, from one NVML sample). Rendering it as text is the command's."""

from __future__ import annotations

from typing import Any

from gpugate.core.budget import GpuBudget

SCHEMA = 1
"""The document's version, its `schema` field: raised when a field changes meaning."""


def budget_document(budget: GpuBudget, age: float | None) -> dict[str, Any]:
    """One GPU's budget in bytes, for JSON."""
    return {
        "index": budget.gpu,
        "uuid": budget.uuid,
        "name": budget.name,
        "sample_age_seconds": None if age is None else round(age, 3),
        "total": budget.total,
        "driver_reserved": budget.reserved,
        "used": budget.used,
        "free": budget.free,
        "external": {row.name: row.bytes for row in budget.external},
        "external_total": budget.external_total,
        "reclaiming": budget.reclaiming,
        "consumers": {
            row.name: {
                "observed": row.observed,
                "resident": row.resident,
                "pending": row.pending,
                "unexplained": row.unexplained,
                "committed": row.committed,
            }
            for row in sorted(budget.consumers, key=lambda r: (-r.committed, r.name))
        },
        "committed_total": budget.committed_total,
        "reserve": budget.reserve,
        "schedulable": budget.schedulable,
    }
