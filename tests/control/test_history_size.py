"""30 days of minute snapshots of 2 GPUs stay well under 50 MB (docs/metrics.md has the figure)."""

from __future__ import annotations

import json
import random

from gpugate.core.units import GiB, MiB
from gpugate.store.db import HistoryPoint, Store

MINUTES = 30 * 24 * 60
LIMIT = 50 * 1000 * 1000


def generated(gpu: int, minute: int, rng: random.Random) -> HistoryPoint:
    """A plausible snapshot: five consumers and two external services with changing bytes."""
    consumers = {
        name: [rng.randrange(0, 8 * GiB), rng.choice((0, 0, 0, rng.randrange(0, 4 * GiB)))]
        for name in ("ollama", "comfyui", "whisper", "mvoice", "vllm")
    }
    external = {"plex": rng.randrange(0, 2 * GiB), "unattributed": rng.randrange(0, 64 * MiB)}
    committed = sum(c for c, _ in consumers.values())
    rows = json.dumps({"external": external, "consumers": consumers}, separators=(",", ":"))
    return HistoryPoint(
        gpu=gpu,
        wall=1_800_000_000.0 + 60 * minute + rng.random(),
        total=24 * GiB,
        driver_reserved=434 * MiB,
        used=committed + sum(external.values()),
        free=rng.randrange(0, 24 * GiB),
        external=sum(external.values()),
        committed=committed,
        pending=sum(p for _, p in consumers.values()),
        reserve=1 * GiB,
        schedulable=rng.randrange(-GiB, 20 * GiB),
        residents=rng.randrange(0, 8),
        queue=rng.randrange(0, 3),
        sample_age=round(rng.random(), 3),
        pressure=rng.random() < 0.01,
        rows=rows,
    )


async def test_thirty_days_of_two_gpus_fit_in_fifty_megabytes(tmp_path):
    path = tmp_path / "history.db"
    store = Store(path, limit=MINUTES * 2 + 1)
    await store.open()
    rng = random.Random(20261201)
    for minute in range(MINUTES):
        for gpu in (0, 1):
            store.record_history(generated(gpu, minute, rng))
    await store.flush()
    assert sum(store.dropped.values()) == 0
    day = await store.history(0, 1_800_000_000.0 + 29 * 86400, step=300)
    assert len(day) == 288
    await store.close()
    size = path.stat().st_size
    print(f"30 days x 2 GPUs: {size / 1e6:.1f} MB")
    assert size < LIMIT
