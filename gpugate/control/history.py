"""The minute history: one snapshot per GPU every minute into the store, old ones pruned.

The loop only reads the gate's books and hands a row to the store's buffer, so it never
waits on the disk. A failure (a store that refuses, a bug in a snapshot) is logged once
per interval with a count; the loop backs off and goes on, because a history with a gap
is worth more than no history.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from gpugate.logs import OncePerInterval
from gpugate.store.db import HistoryPoint

if TYPE_CHECKING:
    from gpugate.gate.gate import Gate

log = logging.getLogger("gpugate.history")

SNAPSHOT_INTERVAL = 60.0
"""Seconds between snapshots."""
PRUNE_INTERVAL = 3600.0
"""Seconds between deletions of rows older than `gate.history_retention`."""
BACKOFF_MAX = 600.0


def snapshot(gate: Gate, wall: float) -> list[HistoryPoint]:
    """Each GPU's budget rows, residents, queue depth and sample age, now."""
    core = gate.core
    now = gate.clock()
    points = []
    for gpu in core.gpus():
        budget = core.budget(gpu)
        if budget is None:
            continue
        rows = {
            "external": {row.name: row.bytes for row in budget.external},
            "consumers": {row.name: [row.committed, row.pending] for row in budget.consumers},
        }
        age = core.sample_age(gpu, now)
        points.append(
            HistoryPoint(
                gpu=gpu,
                wall=round(wall, 3),
                total=budget.total,
                driver_reserved=budget.reserved,
                used=budget.used,
                free=budget.free,
                external=budget.external_total,
                committed=budget.committed_total,
                pending=sum(row.pending for row in budget.consumers),
                reserve=budget.reserve,
                schedulable=budget.schedulable,
                residents=len(core.residents(gpu)),
                queue=len(core.waiting(gpu)),
                sample_age=None if age is None else round(age, 3),
                pressure=core.in_pressure(gpu),
                rows=json.dumps(rows, separators=(",", ":")),
            )
        )
    return points


def point_document(point: HistoryPoint) -> dict[str, Any]:
    """A history point for JSON (`GET /gate/v1/history`)."""
    rows = json.loads(point.rows)
    return {
        "time": point.wall,
        "gpu": point.gpu,
        "total": point.total,
        "driver_reserved": point.driver_reserved,
        "used": point.used,
        "free": point.free,
        "external": point.external,
        "committed": point.committed,
        "pending": point.pending,
        "reserve": point.reserve,
        "schedulable": point.schedulable,
        "schedulable_min": point.schedulable
        if point.schedulable_min is None
        else point.schedulable_min,
        "residents": point.residents,
        "queue": point.queue,
        "sample_age_seconds": point.sample_age,
        "pressure": point.pressure,
        "external_by_service": rows.get("external", {}),
        "consumers": {
            name: {"committed": pair[0], "pending": pair[1]}
            for name, pair in rows.get("consumers", {}).items()
        },
    }


class HistoryRecorder:
    """The snapshot-and-prune task of one control app."""

    def __init__(
        self,
        gate: Gate,
        *,
        interval: float = SNAPSHOT_INTERVAL,
        prune_interval: float = PRUNE_INTERVAL,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.gate = gate
        self.interval = interval
        self.prune_interval = prune_interval
        self.wall = wall
        self.taken = 0
        """Snapshots handed to the store."""
        self.failures = 0
        self._limiter = OncePerInterval(log, max(interval, 60.0))
        self._task: asyncio.Task[None] | None = None
        self._pruned_at: float | None = None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="gpugate-history")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def once(self) -> None:
        """Take one snapshot, and prune when a prune interval has passed."""
        store = self.gate.store
        if store is None:
            return
        wall = self.wall()
        for point in snapshot(self.gate, wall):
            store.record_history(point)
        self.taken += 1
        if self._pruned_at is None or wall - self._pruned_at >= self.prune_interval:
            await store.prune_history(wall - self.gate.config.gate.history_retention)
            self._pruned_at = wall

    async def _run(self) -> None:
        delay = self.interval
        while True:
            await asyncio.sleep(delay)
            try:
                await self.once()
            except Exception as exc:
                self.failures += 1
                delay = min(BACKOFF_MAX, delay * 2)
                self._limiter.warning(
                    f"history:{type(exc).__name__}",
                    "history: cannot take a snapshot (%r); next try in %.0fs",
                    exc,
                    delay,
                )
                continue
            delay = self.interval
