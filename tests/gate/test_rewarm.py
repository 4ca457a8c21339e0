"""Warm again through the gate: bge-m3 (background, `rewarm: true`) evicted for a production
request is loaded again, with no request for it, once that model's memory comes back; by a
lease of its own, answered by the simulated Ollama, and nothing left held.

The simulated card: 16 GiB, 434 MiB driver-reserved, 1 GiB reserve: 14,926 MiB schedulable.
"""

from __future__ import annotations

import asyncio

import ollama
import pytest

from gpugate.core.effects import EventKind
from tests.gate.harness import DEFAULT_MODELS_YAML, PRODUCTION, running_stack

WAIT = 60.0
"""Generous: both cores may be busy."""


def models_yaml(rewarm: str) -> str:
    return DEFAULT_MODELS_YAML.replace(
        "bge-m3: {class: background,", f"bge-m3: {{class: background, rewarm: {rewarm},"
    )


async def evict_bge_for_production(stack) -> None:
    await ollama.AsyncClient(host=stack.gate_url).generate(
        model="gemma3:12b", prompt="x", options={"num_predict": 1}
    )  # interactive, 7,796 MiB
    await ollama.AsyncClient(host=stack.gate_url).embed(model="bge-m3", input="x")  # 2,012 MiB
    evicted = stack.next_event(EventKind.EVICTION_DONE, model="bge-m3:latest")
    # qwen2.5:7b (5,700 MiB) does not fit beside both: bge-m3, the lowest class, goes. Its
    # keep_alive 0 gives its memory back as soon as its request ends.
    await ollama.AsyncClient(
        host=stack.gate_url, headers={"Authorization": "Bearer prod-token"}
    ).generate(model="qwen2.5:7b", prompt="x", options={"num_predict": 1}, keep_alive=0)
    event = await asyncio.wait_for(evicted, WAIT)
    assert event.reason == "eviction"


@pytest.mark.parametrize("rewarm", ["true", "false"])
async def test_a_model_evicted_for_a_higher_class_comes_back_when_the_memory_does(
    tmp_path, sim_host, fakenvml_path, rewarm
):
    async with running_stack(
        tmp_path, sim_host, fakenvml_path, extra=PRODUCTION, models_yaml=models_yaml(rewarm)
    ) as stack:
        done = stack.next_event(EventKind.REWARM_DONE, model="bge-m3:latest")
        qwen_gone = stack.next_event(EventKind.EVICTION_DONE, model="qwen2.5:7b")
        await evict_bge_for_production(stack)
        await asyncio.wait_for(qwen_gone, WAIT)
        if rewarm == "false":
            # Its memory is back and nothing brings it back: a sample later, still gone.
            stack.gate.observe(await stack.gate.sampler.sample())
            assert stack.gate.core.rewarms.evicted == {}
            assert "bge-m3:latest" not in {m["name"] for m in await stack.ps()}
            assert not done.done()
            return
        event = await asyncio.wait_for(done, WAIT)
        assert (event.consumer, event.gpu, event.reason) == ("ollama", 0, "done")
        listed = sorted(m["name"] for m in await stack.ps())
        assert listed == ["bge-m3:latest", "gemma3:12b"], stack.trail()
        resident = next(r for r in stack.gate.core.residents() if r.key.model == "bge-m3:latest")
        assert resident.idle and resident.priority.label == "background"
        # It keeps the time-to-live it had left: it ends 901 s after its last request.
        expires = resident.expires_at()
        assert expires is not None and expires < resident.last_used + 901.0
        assert stack.gate.core.leases() == [] and stack.gate.core.waiting() == []
        assert stack.gate.core.rewarms.evicted == {}
        assert stack.gate.core.rewarms.under_way == {}
        assert stack.host.ooms() == []
        kinds = [e.kind for e in stack.gate.recent_events() if e.model == "bge-m3:latest"]
        assert kinds.count(EventKind.REWARM_STARTED) == 1


async def test_an_unload_asked_through_the_gate_is_seen_at_once_and_its_room_warms_again(
    tmp_path, sim_host, fakenvml_path
):
    # A sample an hour apart: only the unload's own fast sampling can see the memory come
    # back within the wait (an eviction's reclaim check samples for itself). gemma3:12b
    # (interactive) is idle past yield_after all along, as on a machine slow enough: it
    # would yield to a waiting background request, never to bge-m3's rewarm.
    async with running_stack(
        tmp_path,
        sim_host,
        fakenvml_path,
        extra=PRODUCTION + "queue:\n  yield_after: 1ms\n",
        models_yaml=models_yaml("true"),
        sample_interval="1h",
        stale_after="2h",
    ) as stack:
        done = stack.next_event(EventKind.REWARM_DONE, model="bge-m3:latest")
        await ollama.AsyncClient(host=stack.gate_url).generate(
            model="gemma3:12b", prompt="x", options={"num_predict": 1}
        )
        await ollama.AsyncClient(host=stack.gate_url).embed(model="bge-m3", input="x")
        evicted = stack.next_event(EventKind.EVICTION_DONE, model="bge-m3:latest")
        await ollama.AsyncClient(
            host=stack.gate_url, headers={"Authorization": "Bearer prod-token"}
        ).generate(model="qwen2.5:7b", prompt="x", options={"num_predict": 1})
        await asyncio.wait_for(evicted, WAIT)
        assert not done.done()
        # The client unloads qwen2.5:7b (no prompt, keep_alive 0): Ollama stops its runner.
        unloaded = await ollama.AsyncClient(host=stack.gate_url).generate(
            model="qwen2.5:7b", keep_alive=0
        )
        assert unloaded.done_reason == "unload"
        event = await asyncio.wait_for(done, WAIT)
        assert (event.consumer, event.gpu, event.reason) == ("ollama", 0, "done")
        listed = sorted(m["name"] for m in await stack.ps())
        assert listed == ["bge-m3:latest", "gemma3:12b"], stack.trail()
        assert stack.gate.core.leases() == [] and stack.gate.core.waiting() == []
        assert stack.host.ooms() == []
