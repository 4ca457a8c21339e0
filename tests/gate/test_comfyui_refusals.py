"""With the card full, none of 156 prompts ComfyUI refuses (files it does not have, custom
nodes refusing, cycles, bad values behind nodes the gate cannot judge) evicts anyone or
waits for a lease: the gate answers ComfyUI's own refusal, or forwards the prompt for
ComfyUI to judge, leased only when the free memory holds it (and released at the refusal).
A prompt ComfyUI accepts is still leased, evicting the idle background model it needs the
room of."""

from __future__ import annotations

import asyncio
import json

import aiohttp
import pytest

from gpugate.core.effects import Event, EventKind
from gpugate.core.units import MiB
from gpugate.gate.exchange import LEASE_HEADER
from tests.gate.comfyui_stack import comfy_stack
from tests.runtimes.comfyui_refusals import ORDER_DEPENDENT, corpus, lay_out, normal
from tests.sim.comfyui_helpers import txt2img


@pytest.fixture
async def stack(tmp_path, sim_host, fakenvml_path):
    async with comfy_stack(
        tmp_path, sim_host, fakenvml_path, custom_nodes=("checked_nodes",)
    ) as stack:
        lay_out(stack.comfy.input_dir, stack.comfy.output_dir)
        yield stack


async def fill_the_card(
    stack, sim_host, session: aiohttp.ClientSession, transcoder: asyncio.subprocess.Process
) -> None:
    """gemma3:12b (production), bge-m3 (background, idle) and a transcoder outside the
    gate: about 1.4 GiB schedulable, less than any of the corpus's prompts (2.3 GiB)."""
    for route, body in (
        ("/api/generate", {"model": "gemma3:12b", "prompt": "hi", "stream": False}),
        ("/api/embed", {"model": "bge-m3", "input": "hi"}),
    ):
        async with session.post(f"{stack.gate_ollama}{route}", json=body) as resp:
            assert resp.status == 200, await resp.text()
    sim_host.allocate(transcoder.pid, 3500 * MiB, name="Plex Transcoder")
    stack.gate.observe(await stack.gate.sampler.sample())
    budget = stack.gate.core.budget(0)
    assert budget is not None and budget.schedulable < 2 * 1024 * MiB


async def test_no_refused_prompt_is_leased_or_evicts(stack, sim_host):
    seen: list[Event] = []
    transcoder = await asyncio.create_subprocess_exec("sleep", "600")
    try:
        await _corpus_through_the_gate(stack, sim_host, transcoder, seen)
    finally:
        transcoder.kill()
        await transcoder.wait()
    assert sim_host.ooms() == []


async def _corpus_through_the_gate(stack, sim_host, transcoder, seen: list[Event]) -> None:
    async with aiohttp.ClientSession() as session:
        await fill_the_card(stack, sim_host, session, transcoder)
        stack.gate.events.subscribe(seen.append, routine=True)
        differ = []
        for what, prompt in corpus():
            body = json.dumps({"prompt": prompt}).encode()
            async with session.post(f"{stack.gate_comfy}/prompt", data=body) as resp:
                gated = resp.status, LEASE_HEADER in resp.headers, await resp.json()
            async with session.post(f"{stack.direct_comfy}/prompt", data=body) as resp:
                direct = resp.status, await resp.json()
            assert gated[0] == 400, what
            if what not in ORDER_DEPENDENT and normal(gated[2]) != normal(direct[1]):
                differ.append(what)
        assert differ == []
        comfy = [e for e in seen if e.key is not None and e.key.consumer == "comfyui"]
        # Leased, if at all, from the free memory at once: nobody waited or was evicted.
        # With the card full only graphs of images fit, and they need none of it.
        granted = [e for e in comfy if e.kind is EventKind.LEASE_GRANTED]
        assert all(e.wait == 0 and e.bytes == 0 for e in granted)
        assert [e for e in comfy if e.kind is EventKind.TICKET_QUEUED] == []
        assert [e for e in seen if e.kind is EventKind.EVICTION_STARTED] == []
        assert [x for x in stack.gate.core.leases() if x.key.consumer == "comfyui"] == []
        assert {r.key.model for r in stack.gate.core.residents()} >= {"gemma3:12b", "bge-m3:latest"}
        # The card was full for them: a prompt ComfyUI accepts evicts bge-m3 for its lease.
        evicted = stack.next_event(EventKind.EVICTION_STARTED)
        async with session.post(
            f"{stack.gate_comfy}/prompt", json={"prompt": txt2img(seed=7)}
        ) as resp:
            assert resp.status == 200, await resp.text()
            assert LEASE_HEADER in resp.headers
        assert (await evicted).key.model == "bge-m3:latest"
