"""keep_alive is capped by policy; the gate owns the idle time of /v1 loads."""

from __future__ import annotations

from datetime import UTC, datetime

import aiohttp
import ollama
import openai
import pytest

from gpugate.core.effects import EventKind
from tests.gate.harness import DEFAULT_MODELS_YAML, running_stack


def seconds_left(entry: dict) -> float:
    expires = datetime.fromisoformat(entry["expires_at"].replace("Z", "+00:00"))
    return (expires - datetime.now(UTC)).total_seconds()


async def test_a_24h_keep_alive_ends_with_the_policy_ttl(stack):
    client = ollama.AsyncClient(host=stack.gate_url)
    await client.generate(
        model="gemma3:12b", prompt="hi", keep_alive="24h", options={"num_predict": 2}
    )
    (entry,) = await stack.ps()
    assert entry["name"] == "gemma3:12b"
    assert 14 * 60 < seconds_left(entry) <= 15 * 60


async def test_a_shorter_keep_alive_is_kept_and_forever_is_capped(stack):
    client = ollama.AsyncClient(host=stack.gate_url)
    await client.generate(
        model="llama3.2:3b", prompt="hi", keep_alive="2m", options={"num_predict": 1}
    )
    assert 60 < seconds_left((await stack.ps())[0]) <= 120
    await client.generate(
        model="llama3.2:3b", prompt="hi", keep_alive=-1, options={"num_predict": 1}
    )
    assert 14 * 60 < seconds_left((await stack.ps())[0]) <= 15 * 60


async def test_per_model_ttl_applies(stack):
    await ollama.AsyncClient(host=stack.gate_url).embed(model="bge-m3", input="x", keep_alive="1h")
    (entry,) = await stack.ps()
    assert 890 < seconds_left(entry) <= 901


@pytest.mark.parametrize("value", ["300", "-1", "soon", True, [1]])
async def test_malformed_keep_alive_is_refused_like_ollama(stack, value):
    answers = []
    async with aiohttp.ClientSession() as session:
        for url in (stack.sim_url, stack.gate_url):
            body = {"model": "llama3.2:3b", "prompt": "x", "keep_alive": value}
            async with session.post(url + "/api/generate", json=body) as resp:
                answers.append((resp.status, await resp.json()))
    assert answers[1] == answers[0]
    assert answers[0][0] == 400
    assert stack.gate.core.leases() == [] and stack.gate.core.residents() == []


async def test_v1_loads_are_unloaded_by_the_gate_when_idle(tmp_path, sim_host, fakenvml_path):
    models = DEFAULT_MODELS_YAML.replace(
        "llama3.2:3b: {envelope: 3200MiB}",
        "llama3.2:3b: {envelope: 3200MiB, residency: {policy: keep_warm, ttl: 300ms}}",
    )
    async with running_stack(tmp_path, sim_host, fakenvml_path, models_yaml=models) as stack:
        done = stack.next_event(EventKind.EVICTION_DONE, model="llama3.2:3b")
        client = openai.AsyncOpenAI(base_url=stack.gate_url + "/v1", api_key="x", max_retries=0)
        await client.chat.completions.create(
            model="llama3.2:3b", max_tokens=2, messages=[{"role": "user", "content": "hi"}]
        )
        await client.close()
        # Ollama would keep it for OLLAMA_KEEP_ALIVE (5m here); the gate unloads it.
        event = await done
        assert event.reason == "ttl" and event.detail.startswith("reclaimed; ")
        assert await stack.ps() == []
        assert stack.gate.core.residents() == []


async def test_load_on_demand_is_gone_after_its_request(tmp_path, sim_host, fakenvml_path):
    models = DEFAULT_MODELS_YAML.replace(
        "qwen2.5:7b: {envelope: 5700MiB}",
        "qwen2.5:7b: {envelope: 5700MiB, residency: {policy: load_on_demand}}",
    )
    async with running_stack(tmp_path, sim_host, fakenvml_path, models_yaml=models) as stack:
        done = stack.next_event(EventKind.EVICTION_DONE, model="qwen2.5:7b")
        await ollama.AsyncClient(host=stack.gate_url).generate(
            model="qwen2.5:7b", prompt="x", options={"num_predict": 1}
        )
        await done
        assert await stack.ps() == []
        assert stack.host.read().processes == []


async def test_the_unload_shortcut_passes_and_the_books_follow(stack):
    client = ollama.AsyncClient(host=stack.gate_url)
    await client.generate(model="llama3.2:3b", prompt="x", options={"num_predict": 1})
    gone = stack.next_event(EventKind.RESIDENT_GONE, model="llama3.2:3b")
    reply = await client.generate(model="llama3.2:3b", keep_alive=0)
    assert reply.done_reason == "unload"
    await gone
    assert stack.gate.core.residents() == []
