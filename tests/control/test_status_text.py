"""`gpugate status` as a person reads it: a paused GPU and a draining consumer open the
output with one line each (since when, by whom, the command that undoes it) and mark the
GPU and the consumer's row; without any, the table is as it always was."""

from __future__ import annotations

import asyncio
import io
import re
import time

from gpugate.commands.status import render_text, run_status
from gpugate.core.effects import EventKind
from tests.control.operated import operated_gate


def stamp(wall: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(wall))


async def paused_and_draining(op) -> asyncio.Future:
    """GPU 0 paused with render's demand waiting on it, trainer draining with a lease;
    12m30s later. Returns the waiting demand's answer."""
    status, _ = await op.post("/gate/v1/leases", {"consumer": "trainer", "bytes": "2GiB"})
    assert status == 201
    await op.post("/gate/v1/gpus/0/pause")
    await op.post("/gate/v1/consumers/trainer/drain")
    queued = op.gate.events.next(lambda e: e.kind is EventKind.TICKET_QUEUED)
    ask = asyncio.ensure_future(
        op.post("/gate/v1/leases", {"consumer": "render", "bytes": "1GiB", "max_wait": 3600})
    )
    await asyncio.wait_for(queued, 10)
    op.clock.now += 750
    return ask


async def test_a_pause_and_a_drain_open_the_status_with_when_who_and_the_undo(tmp_path):
    async with operated_gate(tmp_path) as op:
        ask = await paused_and_draining(op)
        document = await op.get("/gate/v1/status")
        lines = render_text(document).splitlines()
        gpu = document["gpus"][0]
        trainer = next(c for c in document["consumers"] if c["consumer"] == "trainer")
        assert lines[0] == (
            f"PAUSED    GPU 0 since {stamp(gpu['paused_since'])} (12m30s ago) by token:"
            " new loads wait in its queue (1 waiting); undo: gpugate resume --gpu 0"
        )
        assert lines[1] == (
            f"DRAINING  trainer since {stamp(trainer['draining_since'])} (12m30s ago) by token:"
            " admits nothing new, 1 lease(s) in flight; undo: gpugate undrain trainer"
        )
        assert lines[2].startswith("GPU 0  fake  GPU-0") and lines[2].endswith("  PAUSED")
        rows = {line.split()[0]: line for line in lines if line.startswith("    ")}
        assert rows["trainer"].endswith("   DRAINING")
        assert not rows["render"].endswith("DRAINING")

        await op.post("/gate/v1/gpus/0/resume")
        status, _ = await asyncio.wait_for(ask, 10)
        assert status == 201
        await op.post("/gate/v1/consumers/trainer/undrain")
        text = render_text(await op.get("/gate/v1/status"))
        assert not re.search(r"PAUSED|DRAIN", text)
        assert text.splitlines()[0].startswith("GPU 0  fake  GPU-0")


async def test_gpugate_status_prints_the_markers_from_the_running_gate(tmp_path):
    async with operated_gate(tmp_path) as op:
        ask = await paused_and_draining(op)
        config = tmp_path / "cli.yaml"
        config.write_text(f"gate:\n  control: 127.0.0.1:{op.client.server.port}\n")
        out = io.StringIO()
        # `gpugate status` runs its own event loop: in a thread, while this one serves it.
        code = await asyncio.to_thread(run_status, config, as_json=False, out=out)
        assert code == 0
        lines = out.getvalue().splitlines()
        assert re.fullmatch(
            r"PAUSED    GPU 0 since \d{4}-\d\d-\d\d \d\d:\d\d:\d\d \(12m30s ago\) by token: "
            r"new loads wait in its queue \(1 waiting\); undo: gpugate resume --gpu 0",
            lines[0],
        ), lines[0]
        assert lines[1].startswith("DRAINING  trainer since ")
        assert lines[1].endswith("undo: gpugate undrain trainer")
        await op.post("/gate/v1/gpus/0/resume")
        await asyncio.wait_for(ask, 10)


def test_what_is_not_known_is_left_out_and_a_drained_consumer_says_so():
    document = {
        "source": "gate",
        "gpus": [],
        "queue": [],
        "consumers": [
            {"consumer": "a", "draining": True, "drained": True, "leases": 0},
            {"consumer": "b", "draining": False, "drained": False, "leases": 2},
        ],
    }
    gpu = {
        "index": 1,
        "name": "card",
        "uuid": "GPU-1",
        "sample_age_seconds": 0.5,
        "total": 0,
        "driver_reserved": 0,
        "external": {},
        "external_total": 0,
        "consumers": {},
        "committed_total": 0,
        "reserve": 0,
        "schedulable": 0,
        "paused": True,
        "paused_since": None,
        "paused_seconds": 90.0,
        "paused_by": None,
    }
    document["gpus"] = [gpu]
    lines = render_text(document).splitlines()
    assert lines[0] == (
        "PAUSED    GPU 1 for 1m30s: new loads wait in its queue (0 waiting);"
        " undo: gpugate resume --gpu 1"
    )
    assert lines[1] == "DRAINED   a: admits nothing new, no lease left; undo: gpugate undrain a"
    assert lines[2] == "GPU 1  card  GPU-1  sample 0.5s old  PAUSED"


def test_a_document_sampled_from_nvml_has_no_markers():
    gpu = {
        "index": 0,
        "name": "card",
        "uuid": "GPU-0",
        "sample_age_seconds": 0.0,
        "total": 0,
        "driver_reserved": 0,
        "external": {},
        "external_total": 0,
        "consumers": {"a": {"observed": 0, "resident": 0, "pending": 0, "committed": 0}},
        "committed_total": 0,
        "reserve": 0,
        "schedulable": 0,
    }
    document = {"source": "nvml", "note": "no gate running", "gpus": [gpu]}
    lines = render_text(document).splitlines()
    assert lines[:2] == ["no gate running", "GPU 0  card  GPU-0  sample 0.0s old"]
    assert not any("PAUSED" in line or "DRAIN" in line for line in lines)
