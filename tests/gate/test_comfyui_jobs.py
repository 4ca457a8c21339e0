"""A ComfyUI consumer behind the gate: a prompt's lease lives as long as its job.

The simulated ComfyUI runs the prompts; the gate learns their ends from `/history` and
`/queue` only (it never opens a socket with a client's id).
"""

from __future__ import annotations

import asyncio
import json

import aiohttp
import pytest

from gpugate.core.effects import EventKind
from gpugate.core.job_leases import JOBS_MODEL
from gpugate.core.scopes import HELD_MODEL
from gpugate.core.units import GiB, MiB
from gpugate.gate.exchange import FAILURE_HEADER, LEASE_HEADER
from gpugate_sim.device import SimDevice, SimulatedGpuHost
from gpugate_sim.shim import STATE_ENV
from tests.gate.comfyui_stack import comfy_stack
from tests.sim.comfyui_helpers import blank, connect, flux, txt2img


@pytest.fixture
async def stack(tmp_path, sim_host, fakenvml_path):
    async with comfy_stack(tmp_path, sim_host, fakenvml_path) as stack:
        yield stack


@pytest.fixture
async def session():
    async with aiohttp.ClientSession() as http:
        yield http


async def post_prompt(session, url, graph, **fields):
    async with session.post(f"{url}/prompt", json={"prompt": graph, **fields}) as resp:
        return resp.status, resp.headers, await resp.json(content_type=None)


def job_leases(gate):
    return [x for x in gate.core.leases() if x.key.consumer == "comfyui"]


async def test_a_prompt_is_leased_until_its_job_ends_then_its_models_are_a_resident(stack, session):
    gate = stack.gate
    ws = await connect(session, stack.gate_comfy, "c1")
    ended = stack.next_event(EventKind.LEASE_RELEASED, reason="jobs done")
    status, headers, answer = await post_prompt(
        session, stack.gate_comfy, txt2img(), client_id="c1"
    )
    assert status == 200, answer
    assert LEASE_HEADER in headers
    prompt_id = answer["prompt_id"]
    assert len(gate.jobs.live("comfyui")) == 1
    carriers = [x for x in gate.core.leases() if x.key.model == JOBS_MODEL]
    # SD1.5: 2,034 MiB of checkpoint and 0.25 MiB-per-megapixel working set at 512x512.
    assert [x.pending for x in carriers] == [2034 * MiB + 256 * MiB]
    events = await ws.until_done(prompt_id)
    assert events[-2]["type"] == "status" or "execution_success" in [e["type"] for e in events]
    await asyncio.wait_for(ended, 10)
    assert job_leases(gate) == []
    assert gate.core.waiting() == []
    [held] = [r for r in gate.core.residents() if r.key.consumer == "comfyui"]
    assert held.key.model == HELD_MODEL
    # What ComfyUI kept: the checkpoint, beyond its idle context.
    assert held.bytes >= 2034 * MiB
    await ws.ws.close()


async def test_a_client_chosen_prompt_id_names_the_job(stack, session):
    status, _, answer = await post_prompt(session, stack.gate_comfy, blank(), prompt_id="mine-1")
    assert status == 200 and answer["prompt_id"] == "mine-1"
    ended = stack.next_event(EventKind.LEASE_RELEASED, reason="done")
    if stack.gate.jobs.live("comfyui"):
        await asyncio.wait_for(ended, 10)
    assert job_leases(stack.gate) == []


async def test_an_unreadable_graph_goes_up_unleased_for_comfyui_to_answer(stack, session):
    async with session.post(f"{stack.gate_comfy}/prompt", data=b"{not json") as via:
        through = (via.status, await via.read())
        assert LEASE_HEADER not in via.headers
    async with session.post(f"{stack.direct_comfy}/prompt", data=b"{not json") as direct:
        assert through == (direct.status, await direct.read())
    assert job_leases(stack.gate) == []


async def test_a_prompt_comfyui_refuses_ends_its_job_at_once(stack, session):
    graph = txt2img(ckpt="missing.safetensors")
    status, _, answer = await post_prompt(session, stack.gate_comfy, graph)
    assert status == 400
    assert answer["error"]["type"] == "prompt_outputs_failed_validation"
    assert job_leases(stack.gate) == []
    assert stack.gate.core.waiting() == []


async def test_a_refusal_by_the_gate_has_comfyuis_shape(stack, session):
    huge = flux()
    huge["6"]["inputs"].update(width=16384, height=16384)
    status, headers, answer = await post_prompt(session, stack.gate_comfy, huge)
    assert status == 503
    assert headers[FAILURE_HEADER] == "INSUFFICIENT_SCHEDULABLE_VRAM"
    assert set(answer) == {"error", "node_errors"} and answer["node_errors"] == {}
    assert answer["error"]["type"] == "insufficient_schedulable_vram"
    assert answer["error"]["extra_info"]["failure_class"] == "INSUFFICIENT_SCHEDULABLE_VRAM"
    assert job_leases(stack.gate) == []
    assert stack.gate.core.waiting() == []


async def test_a_deleted_pending_prompt_and_an_interrupted_one_end_their_jobs(stack, session):
    gate = stack.gate
    ws = await connect(session, stack.gate_comfy, "c2")
    _, _, first = await post_prompt(session, stack.gate_comfy, txt2img(steps=400), client_id="c2")
    _, _, second = await post_prompt(session, stack.gate_comfy, txt2img(seed=2), client_id="c2")
    assert len(gate.jobs.live("comfyui")) == 2
    await ws.until("execution_start")
    deleted = stack.next_event(EventKind.LEASE_RELEASED, reason="failed")
    async with session.post(
        f"{stack.gate_comfy}/queue", json={"delete": [second["prompt_id"]]}
    ) as resp:
        assert resp.status == 200
    await asyncio.wait_for(deleted, 10)
    assert len(gate.jobs.live("comfyui")) == 1
    ended = stack.next_event(EventKind.LEASE_RELEASED, reason="jobs done")
    async with session.post(f"{stack.gate_comfy}/interrupt", json={}) as resp:
        assert resp.status == 200
    await ws.until("execution_interrupted")
    await asyncio.wait_for(ended, 10)
    assert job_leases(gate) == []
    assert first["prompt_id"] != second["prompt_id"]
    await ws.ws.close()


async def test_comfyuis_cached_models_are_evicted_with_free_for_a_demand(stack, session):
    gate = stack.gate
    ws = await connect(session, stack.gate_comfy, "c3")
    ended = stack.next_event(EventKind.LEASE_RELEASED, reason="jobs done")
    _, _, answer = await post_prompt(session, stack.gate_comfy, flux(), client_id="c3")
    events = await ws.until_done(answer["prompt_id"])
    assert "execution_success" in [e["type"] for e in events]
    await asyncio.wait_for(ended, 10)
    [held] = [r for r in gate.core.residents() if r.key.model == HELD_MODEL]
    assert held.bytes > 11000 * MiB
    # qwen2.5:7b (5,700 MiB, interactive) fits only once ComfyUI's models are gone.
    evicted = stack.next_event(EventKind.EVICTION_STARTED)
    async with session.post(
        f"{stack.gate_ollama}/api/generate",
        json={"model": "qwen2.5:7b", "prompt": "hi", "stream": False},
    ) as resp:
        assert resp.status == 200, await resp.text()
    event = evicted.result()
    assert event.key.model == HELD_MODEL
    assert [r for r in gate.core.residents() if r.key.consumer == "comfyui"] == []
    observed = gate.core.observation(0).managed.get("comfyui", 0)
    assert observed <= 210 * MiB
    await ws.ws.close()


@pytest.mark.parametrize("prompt_id", ["\ud800", "a/b", "..", "x" * 300, "caf\u00e9 %2F"])
async def test_a_job_whose_id_no_path_can_name_still_ends(stack, session, prompt_id):
    ended = stack.next_event(EventKind.LEASE_RELEASED, reason="jobs done")
    body = json.dumps({"prompt": txt2img(), "prompt_id": prompt_id}).encode()
    async with session.post(f"{stack.gate_comfy}/prompt", data=body) as resp:
        assert resp.status == 200, await resp.text()
        assert LEASE_HEADER in resp.headers
    await asyncio.wait_for(ended, 10)
    assert job_leases(stack.gate) == []


async def test_a_prompt_its_class_could_never_get_whole_is_granted_its_floor(
    tmp_path, fakenvml_path, monkeypatch
):
    # A 24 GiB card holding gemma3:12b (production, 7.6 GiB), which an interactive prompt
    # may never evict: FLUX wants 17.6 GiB, the card could give it 15.0 GiB at most. It is
    # granted its floor, degraded, and ComfyUI loads it into what it finds free.
    host = SimulatedGpuHost.create(
        tmp_path / "gpu", [SimDevice(0, 24 * GiB, 434 * MiB, "GPU-24", "NVIDIA GeForce RTX 4090")]
    )
    monkeypatch.setenv(STATE_ENV, str(host.state_path))
    async with comfy_stack(tmp_path, host, fakenvml_path) as stack, aiohttp.ClientSession() as s:
        async with s.post(
            f"{stack.gate_ollama}/api/generate",
            json={"model": "gemma3:12b", "prompt": "hi", "stream": False},
        ) as resp:
            assert resp.status == 200, await resp.text()
        gate = stack.gate
        kept = sum(r.bytes for r in gate.core.residents(0) if r.key.model == "gemma3:12b")
        assert kept >= 7796 * MiB
        degraded = stack.next_event(EventKind.DEGRADED, consumer="comfyui")
        ended = stack.next_event(EventKind.LEASE_RELEASED, reason="jobs done")
        status, _, answer = await post_prompt(s, stack.gate_comfy, flux())
        assert status == 200, answer
        event = await asyncio.wait_for(degraded, 10)
        # gemma3:12b goes only at its residency's end, long after the prompt's maximum wait.
        assert event.reason == "DEADLINE_CANNOT_BE_MET", event.detail
        assert event.bytes is not None and event.ceiling is not None
        assert event.bytes < 11350 * MiB and event.ceiling > 17 * GiB
        [carrier] = [x for x in job_leases(gate) if x.key.model == JOBS_MODEL]
        assert carrier.pending == event.bytes
        await asyncio.wait_for(ended, 30)
        assert [r.key.model for r in gate.core.residents(0) if r.key.consumer == "ollama"] == [
            "gemma3:12b"
        ]
        assert job_leases(gate) == []
        assert host.ooms() == []


async def test_what_comfyui_kept_is_taken_into_its_next_job_without_a_resident_gone(stack, session):
    gate = stack.gate
    ws = await connect(session, stack.gate_comfy, "c7")
    gone = []
    gate.events.subscribe(lambda e: e.kind is EventKind.RESIDENT_GONE and gone.append(e))
    for seed in (1, 2):
        ended = stack.next_event(EventKind.LEASE_RELEASED, reason="jobs done")
        status, _, answer = await post_prompt(
            session, stack.gate_comfy, txt2img(seed=seed), client_id="c7"
        )
        assert status == 200, answer
        await ws.until_done(answer["prompt_id"])
        await asyncio.wait_for(ended, 10)
        [held] = [r for r in gate.core.residents() if r.key.consumer == "comfyui"]
        assert held.key.model == HELD_MODEL and held.bytes >= 2034 * MiB
    # The second job's lease counted what ComfyUI kept; NVML showed it all along.
    assert gone == []
    await ws.ws.close()
