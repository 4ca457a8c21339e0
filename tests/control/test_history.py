"""The minute history: snapshots in a real SQLite file, kept across a restart, pruned,
downsampled by `GET /gate/v1/history`, and a loop that survives a failing store."""

from __future__ import annotations

import asyncio
import json
import logging

import aiohttp
import attrs

from gpugate.control.history import HistoryRecorder, snapshot
from gpugate.core.units import GiB, MiB
from gpugate.store.db import HistoryPoint, MeasuredEnvelope, Store
from tests.gate.harness import running_stack

DAY = 86400.0


def point(gpu: int, wall: float, schedulable: int) -> HistoryPoint:
    rows = {"external": {"plex": 512 * MiB}, "consumers": {"ollama": [4 * GiB, 0]}}
    return HistoryPoint(
        gpu=gpu,
        wall=wall,
        total=16 * GiB,
        driver_reserved=434 * MiB,
        used=5 * GiB,
        free=11 * GiB,
        external=512 * MiB,
        committed=4 * GiB,
        pending=0,
        reserve=1 * GiB,
        schedulable=schedulable,
        residents=1,
        queue=0,
        sample_age=0.2,
        pressure=False,
        rows=json.dumps(rows, separators=(",", ":")),
    )


async def history(url: str, **query: str) -> tuple[int, dict]:
    async with (
        aiohttp.ClientSession() as session,
        session.get(url + "/gate/v1/history", params=query) as resp,
    ):
        return resp.status, await resp.json()


async def test_snapshots_survive_a_restart_and_are_read_back_by_gpu_and_step(
    tmp_path, sim_host, fakenvml_path
):
    async with running_stack(tmp_path, sim_host, fakenvml_path, database=True) as stack:
        recorder = HistoryRecorder(stack.gate)
        await recorder.once()
        (taken,) = snapshot(stack.gate, 0.0)
        await stack.gate.store.flush()
    assert stack.config.gate.database.exists()

    async with running_stack(tmp_path, sim_host, fakenvml_path, database=True) as stack:
        status, body = await history(stack.control_url, gpu="0", since="1h")
        assert status == 200, body
        (kept,) = body["points"]
        assert kept["gpu"] == 0 and kept["total"] == taken.total == 16 * GiB
        assert kept["schedulable"] == taken.schedulable
        assert kept["driver_reserved"] == 434 * MiB and kept["residents"] == 0
        assert kept["queue"] == 0 and kept["sample_age_seconds"] is not None
        assert body["retention"] == 30 * DAY

        status, body = await history(stack.control_url, gpu="1")
        assert status == 200 and body["points"] == []
        status, body = await history(stack.control_url, step="nonsense")
        assert status == 400 and body["error"]["class"] == "BAD_REQUEST"


async def test_downsampling_keeps_the_last_point_of_a_step_and_the_lowest_schedulable(tmp_path):
    store = Store(tmp_path / "h.db")
    await store.open()
    start = 1_800_000_000.0
    for minute in range(10):
        store.record_history(point(0, start + 60 * minute, (10 - minute) * GiB))
        store.record_history(point(1, start + 60 * minute, 1 * GiB))
    await store.flush()
    points = await store.history(0, start, step=300)
    assert [p.wall for p in points] == [start + 240, start + 540]
    assert [p.schedulable for p in points] == [6 * GiB, 1 * GiB]
    assert [p.schedulable_min for p in points] == [6 * GiB, 1 * GiB]
    assert len(await store.history(None, start)) == 20
    assert await store.prune_history(start + 300) == 10
    assert [p.wall for p in await store.history(0, 0)] == [start + 60 * m for m in range(5, 10)]
    await store.close()


async def test_old_snapshots_are_pruned_by_the_recorder(tmp_path, sim_host, fakenvml_path):
    async with running_stack(tmp_path, sim_host, fakenvml_path, database=True) as stack:
        gate = stack.gate
        gate.config = attrs.evolve(
            gate.config, gate=attrs.evolve(gate.config.gate, history_retention=DAY)
        )
        now = 1_800_000_000.0
        gate.store.record_history(point(0, now - 2 * DAY, 1 * GiB))
        gate.store.record_history(point(0, now - DAY / 2, 1 * GiB))
        await gate.store.flush()
        recorder = HistoryRecorder(gate, wall=lambda: now)
        await recorder.once()
        await gate.store.flush()
        walls = [p.wall for p in await gate.store.history(0, 0)]
        assert walls == [now - DAY / 2, now]


async def test_the_loop_goes_on_after_a_failure_and_logs_it_once(
    tmp_path, sim_host, fakenvml_path, caplog
):
    async with running_stack(tmp_path, sim_host, fakenvml_path) as stack:
        store = stack.gate.store
        calls = 0
        original = store.prune_history
        written = asyncio.Event()

        async def flaky(before: float) -> int:
            nonlocal calls
            calls += 1
            if calls <= 3:
                raise OSError("disk on fire")
            written.set()
            return await original(before)

        store.prune_history = flaky  # type: ignore[method-assign]
        recorder = HistoryRecorder(stack.gate, interval=0.01, prune_interval=0.0)
        recorder._limiter.interval = 3600.0
        with caplog.at_level(logging.WARNING, logger="gpugate.history"):
            recorder.interval = 0.01
            recorder.start()
            # The backoff doubles from 10 ms: three failures take well under a second.
            await asyncio.wait_for(written.wait(), 10)
            await recorder.stop()
        assert recorder.failures == 3
        lines = [r for r in caplog.records if "cannot take a snapshot" in r.getMessage()]
        assert len(lines) == 1 and "disk on fire" in lines[0].getMessage()


async def test_envelopes_carry_when_and_the_runtime_version(tmp_path, sim_host, fakenvml_path):
    async with running_stack(tmp_path, sim_host, fakenvml_path, database=True) as stack:
        store = stack.gate.store
        store.record_envelope(MeasuredEnvelope("ollama", "bge-m3:latest", "", 2012 * MiB))
        store.record_envelope(
            MeasuredEnvelope("ollama", "gemma3:12b", "", 7796 * MiB, runtime_version="0.33.0")
        )
        await store.flush()
        async with (
            aiohttp.ClientSession() as session,
            session.get(stack.control_url + "/gate/v1/envelopes") as resp,
        ):
            body = await resp.json()
    rows = {e["model"]: e for e in body["envelopes"]}
    assert rows["gemma3:12b"]["runtime_version"] == "0.33.0"
    assert rows["bge-m3:latest"]["runtime_version"] is None
    assert rows["bge-m3:latest"]["measured"] > 1_700_000_000
    assert rows["gemma3:12b"]["bytes"] == 7796 * MiB
