"""What a person reads of a ComfyUI prompt's lease: its own bytes, though the consumer's
job lease (`<jobs>`) is what carries them in the budget."""

from __future__ import annotations

import asyncio
import json

import aiohttp
import pytest

from gpugate.core.effects import EventKind
from gpugate.core.job_leases import JOBS_MODEL
from gpugate.core.units import MiB
from tests.gate.comfyui_stack import comfy_stack
from tests.sim.comfyui_helpers import connect, txt2img

SD15_AT_512 = 2034 * MiB + 256 * MiB
"""The checkpoint and 0.25 megapixels of working set at 1 GiB per megapixel."""


@pytest.fixture
async def stack(tmp_path, sim_host, fakenvml_path):
    async with comfy_stack(tmp_path, sim_host, fakenvml_path) as stack:
        yield stack


def control_url(stack) -> str:
    return f"http://{stack.gate.config.gate.control}"


async def test_a_jobs_grant_release_and_listing_say_its_own_bytes(stack):
    gate = stack.gate
    async with aiohttp.ClientSession() as session:
        ws = await connect(session, stack.gate_comfy, "c1")
        posted = []
        # The first runs long enough to be read while live; the second fits in the job
        # lease the first grew, so it grows it by nothing.
        for graph in (txt2img(steps=2000), txt2img(seed=2)):
            async with session.post(
                stack.gate_comfy + "/prompt", json={"prompt": graph, "client_id": "c1"}
            ) as resp:
                assert resp.status == 200
                posted.append((await resp.json())["prompt_id"])
        assert len(gate.jobs.live("comfyui")) == 2
        async with session.get(control_url(stack) + "/gate/v1/leases?scope=job") as resp:
            listed = (await resp.json())["leases"]
        assert sorted((x["model"] == JOBS_MODEL, x["bytes"]) for x in listed) == [
            (False, SD15_AT_512),
            (False, SD15_AT_512),
            (True, SD15_AT_512),
        ]
        # Two jobs, counted once: the budget has the largest, on the job lease.
        rows = {row.name: row for row in gate.core.budget(0).consumers}
        assert rows["comfyui"].pending == SD15_AT_512
        await ws.until("execution_start")
        ended = stack.next_event(EventKind.LEASE_RELEASED, reason="jobs done")
        async with session.post(f"{stack.gate_comfy}/queue", json={"delete": [posted[1]]}) as resp:
            assert resp.status == 200
        async with session.post(f"{stack.gate_comfy}/interrupt", json={}) as resp:
            assert resp.status == 200
        await asyncio.wait_for(ended, 10)
        async with session.get(control_url(stack) + "/gate/v1/events") as resp:
            lines = [json.loads(x) for x in (await resp.text()).splitlines()]
        await ws.ws.close()
    jobs = [x for x in lines if x.get("consumer") == "comfyui" and x["event"].startswith("lease_")]
    shown = sorted((x["event"], x["model"].startswith("job-"), x.get("bytes")) for x in jobs)
    assert shown == [
        ("lease_granted", True, SD15_AT_512),
        ("lease_granted", True, SD15_AT_512),
        ("lease_released", False, SD15_AT_512),  # <jobs>, with the last job
        ("lease_released", True, SD15_AT_512),
        ("lease_released", True, SD15_AT_512),
    ]
