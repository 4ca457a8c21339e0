"""Preemption through the gate: a production Ollama load interrupts a long ComfyUI prompt
when the ComfyUI consumer's `preempt` lists production, and never without it."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest

from gpugate.core.effects import EventKind
from gpugate.core.failures import FailureClass
from gpugate.core.scopes import HELD_MODEL
from gpugate.gate.exchange import FAILURE_HEADER
from tests.gate.comfyui_stack import comfy_stack
from tests.sim.comfyui_helpers import connect, flux

LOAD = {"model": "gemma3:12b", "prompt": "hi", "stream": False}
"""7,796 MiB, class production: it fits only in the memory FLUX's prompt holds."""


@pytest.fixture
async def session():
    async with aiohttp.ClientSession() as http:
        yield http


async def long_flux(stack, session, client):
    """A FLUX prompt of 10,000 steps (50 s here), sampling once this returns."""
    ws = await connect(session, stack.gate_comfy, client)
    async with session.post(
        f"{stack.gate_comfy}/prompt", json={"prompt": flux(steps=10_000), "client_id": client}
    ) as resp:
        assert resp.status == 200, await resp.text()
        prompt_id = (await resp.json())["prompt_id"]
    await ws.until("progress")
    assert [x.id for x in stack.gate.jobs.live("comfyui")]
    return ws, prompt_id


def kinds(gate, since):
    return [(e.kind.value, e.model, e.bytes, e.detail) for e in gate.recent_events()[since:]]


async def test_a_production_load_preempts_a_running_prompt_when_preempt_lists_it(
    tmp_path, sim_host, fakenvml_path, session
):
    async with comfy_stack(
        tmp_path, sim_host, fakenvml_path, more="    preempt: [production]\n"
    ) as stack:
        gate = stack.gate
        ws, prompt_id = await long_flux(stack, session, "c1")
        since = len(gate.recent_events())
        async with session.post(f"{stack.gate_ollama}/api/generate", json=LOAD) as resp:
            assert resp.status == 200, await resp.text()
        interrupted = await ws.until("execution_interrupted")
        assert interrupted["data"]["prompt_id"] == prompt_id

        events = gate.recent_events()[since:]
        [started] = [e for e in events if e.kind is EventKind.PREEMPTION_STARTED]
        assert started.consumer == "comfyui"
        assert f"jobs {prompt_id} of comfyui for ollama/gemma3:12b (production)" in (started.detail)
        [stopped] = [e for e in events if e.kind is EventKind.FAILURE]
        assert stopped.failure.failure_class is FailureClass.RESIDENCY_CONFLICT
        assert f"comfyui's job {prompt_id} (interactive) was preempted for " in (
            stopped.failure.message
        )
        # What ComfyUI kept was evicted with /free and confirmed before the grant.
        order = [(e.kind, e.model) for e in events]
        evicted = (EventKind.EVICTION_DONE, HELD_MODEL)
        granted = (EventKind.LEASE_GRANTED, "gemma3:12b")
        assert evicted in order and granted in order, "\n".join(map(str, kinds(gate, since)))
        assert order.index(evicted) < order.index(granted), "\n".join(map(str, kinds(gate, since)))
        assert gate.jobs.live("comfyui") == []
        assert gate.core.leases() == []
        assert gate.core.waiting() == []
        assert sim_host.ooms() == []
        await ws.ws.close()


async def test_without_preempt_the_prompt_runs_on_and_the_load_fails_by_its_class(
    tmp_path, sim_host, fakenvml_path, session
):
    async with comfy_stack(tmp_path, sim_host, fakenvml_path) as stack:
        gate = stack.gate
        ws, prompt_id = await long_flux(stack, session, "c2")
        since = len(gate.recent_events())
        async with session.post(f"{stack.gate_ollama}/api/generate", json=LOAD) as resp:
            assert resp.status == 503
            assert resp.headers[FAILURE_HEADER] == "INSUFFICIENT_SCHEDULABLE_VRAM"
            assert "error" in await resp.json()
        assert [
            e for e in gate.recent_events()[since:] if e.kind is EventKind.PREEMPTION_STARTED
        ] == []
        assert gate.core.waiting() == []
        assert [x.key.consumer for x in gate.core.leases()] == ["comfyui", "comfyui"]
        async with session.get(f"{stack.direct_comfy}/queue") as resp:
            running = (await resp.json())["queue_running"]
        assert [item[1] for item in running] == [prompt_id]
        # The test stops it itself.
        ended = stack.next_event(EventKind.LEASE_RELEASED, reason="jobs done")
        async with session.post(f"{stack.gate_comfy}/interrupt", json={}) as resp:
            assert resp.status == 200
        await asyncio.wait_for(ended, 10)
        assert gate.core.leases() == []
        await ws.ws.close()
