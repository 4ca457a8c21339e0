"""Through the gate, a body is read as Ollama reads it, and only keep_alive is rewritten.

Every request here is answered through the gate as Ollama answers it directly, the model
that loads is under a lease (never found out of band), and the keep_alive that reaches
Ollama is the capped one.
"""

from __future__ import annotations

import asyncio
import json

import aiohttp
import ollama
import pytest

from gpugate.core.effects import EventKind
from tests.gate.harness import Stack

VOLATILE = {
    "created_at",
    "total_duration",
    "load_duration",
    "prompt_eval_duration",
    "eval_duration",
}


async def post(url: str, path: str, body: bytes) -> tuple[int, dict]:
    async with (
        aiohttp.ClientSession() as session,
        session.post(url + path, data=body, headers={"Content-Type": "application/json"}) as resp,
    ):
        answer = json.loads(await resp.read())
        return resp.status, {k: v for k, v in answer.items() if k not in VOLATILE}


async def loads_under_a_lease(
    stack: Stack, path: str, body: bytes, model: str, keep_alive: float
) -> dict:
    """Through the gate: granted, resident in the gate's books, capped, answered as direct."""
    granted = stack.next_event(EventKind.LEASE_GRANTED, model=model)
    status, answer = await post(stack.gate_url, path, body)
    assert status == 200, answer
    assert (await asyncio.wait_for(granted, 5)).model == model
    (resident,) = stack.gate.core.residents()
    assert resident.key.model == model and not resident.out_of_band
    assert stack.gate.core.leases() == []
    runner = stack.sim.state().runner(model)
    assert runner is not None and runner.keep_alive == keep_alive
    # The same body straight at Ollama, now that the model is loaded, answers alike.
    assert await post(stack.sim_url, path, body) == (status, answer)
    return answer


def keep_alive_at_ollama(stack: Stack, display: str) -> float | None:
    runner = stack.sim.state().runner(display)
    assert runner is not None
    return runner.keep_alive


async def test_a_null_keep_alive_is_capped_like_a_missing_one(stack):
    body = b'{"model":"gemma3:12b","prompt":"hi","stream":false,"keep_alive":null}'
    granted = stack.next_event(EventKind.LEASE_GRANTED, model="gemma3:12b")
    status, _ = await post(stack.gate_url, "/api/generate", body)
    assert status == 200 and granted.done()
    assert keep_alive_at_ollama(stack, "gemma3:12b") == 900.0


async def test_lone_surrogates_and_big_numbers_go_up_byte_for_byte(stack):
    body = (
        b'{"model":"gemma3:12b","prompt":"\\ud800 \xff","stream":false,'
        b'"n":1e400,"options":{"num_predict":2},"keep_alive":"24h"}'
    )
    await loads_under_a_lease(stack, "/api/generate", body, "gemma3:12b", 900.0)


async def test_keys_in_any_case_load_under_a_lease_and_the_last_keep_alive_is_capped(stack):
    body = (
        b'{"Model":"gemma3:12b","keep_alive":"1s","PROMPT":"hi","Stream":false,"KEEP_ALIVE":"24h"}'
    )
    await loads_under_a_lease(stack, "/api/generate", body, "gemma3:12b", 900.0)


@pytest.mark.parametrize(
    "body",
    [
        b'{"model":"gemma3:12b","prompt":"x","n":NaN}',
        b'{"model":"gemma3:12b","prompt":"x","keep_alive":1e400}',
        b'{"model":"gemma3:12b","prompt":"x","options":{"temperature":1e400}}',
        b'{"model":"gemma3:12b","prompt":5}',
        b'{"model":"gemma3:12b","prompt":"x","keep_alive":"300"}',
        b'{"model":"gemma3:12b",}',
        b'{"model":"library/gemma3:12b:x"}',
    ],
)
async def test_bodies_ollama_refuses_go_up_untouched_without_a_lease(stack, body):
    gate = await post(stack.gate_url, "/api/generate", body)
    direct = await post(stack.sim_url, "/api/generate", body)
    assert gate == direct and gate[0] in (400, 404)
    assert stack.gate.core.leases() == [] and stack.gate.core.residents() == []
    assert stack.gate.core.waiting() == [] and stack.sim.state().runners == ()


async def test_every_spelling_of_a_name_is_one_model_with_its_settings(stack):
    client = ollama.AsyncClient(host=stack.gate_url)
    for name in ("library/bge-m3", "registry.ollama.ai/library/BGE-M3:latest", "bge-m3"):
        granted = stack.next_event(EventKind.LEASE_GRANTED, model="bge-m3:latest")
        await client.embed(model=name, input="x", keep_alive="24h")
        assert granted.done()
        (resident,) = stack.gate.core.residents()
        assert resident.key.model == "bge-m3:latest" and not resident.out_of_band
        assert resident.priority.label == "background"  # bge-m3's class in consumers.yaml
        # bge-m3's own TTL from consumers.yaml, whatever the spelling.
        assert keep_alive_at_ollama(stack, "bge-m3:latest") == 901.0
    assert stack.sim.state().counters.loads == 1
    # The listing names it as the gate keys it: nothing out of band appears.
    assert [m["name"] for m in await stack.ps()] == ["bge-m3:latest"]
