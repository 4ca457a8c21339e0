"""Inline eviction for a higher class; waiting, QUEUE_FULL and LEASE_TIMEOUT for a lower one.

The simulated card: 16 GiB, 434 MiB driver-reserved, 1 GiB reserve: 14,926 MiB schedulable.
"""

from __future__ import annotations

import asyncio

import aiohttp
import attrs
import ollama
import pytest

from gpugate.core.effects import EventKind
from tests.gate.harness import DEFAULT_MODELS_YAML, MODELS, running_stack

IDENTITIES = """\
classes:
  background: {max_wait: 1s}
identities:
  - name: ops
    tokens: [prod-token]
    class: production
"""
SLOW_MODELS = DEFAULT_MODELS_YAML.replace(
    "llama3.2:3b: {envelope: 3200MiB}", "llama3.2:3b: {class: benchmark, envelope: 3200MiB}"
)


async def load(url: str, model: str, **kw) -> None:
    await ollama.AsyncClient(host=url, **kw).generate(
        model=model, prompt="x", options={"num_predict": 1}
    )


# llama3.2 answers at 4 tokens/s, so a request to it keeps it busy for a while.
SLOW_LLAMA = tuple(
    attrs.evolve(m, tokens_per_second=4.0) if m.name == "llama3.2:3b" else m for m in MODELS
)


@pytest.fixture
async def prod_stack(tmp_path, sim_host, fakenvml_path):
    async with running_stack(
        tmp_path,
        sim_host,
        fakenvml_path,
        extra=IDENTITIES,
        models_yaml=SLOW_MODELS,
        consumer_yaml="queue_limit: 1\n",
        models=SLOW_LLAMA,
    ) as stack:
        yield stack


async def test_higher_class_evicts_idle_lower_inline_and_succeeds(prod_stack):
    stack = prod_stack
    await load(stack.gate_url, "gemma3:12b")  # interactive, 7,796 MiB
    await ollama.AsyncClient(host=stack.gate_url).embed(model="bge-m3", input="x")  # background
    evicted = stack.next_event(EventKind.EVICTION_DONE, model="bge-m3:latest")
    # qwen (5,700 MiB) does not fit in the 5,118 MiB left: bge-m3, the lowest class, goes.
    await load(stack.gate_url, "qwen2.5:7b", headers={"Authorization": "Bearer prod-token"})
    event = await evicted
    assert (event.reason, event.detail.partition(";")[0]) == ("eviction", "reclaimed")
    trail = [(e.kind.value, e.model, e.detail) for e in stack.gate.recent_events()]
    assert sorted(m["name"] for m in await stack.ps()) == ["gemma3:12b", "qwen2.5:7b"], "\n".join(
        map(str, trail)
    ) + str(stack.sim.state())
    assert stack.host.ooms() == []
    assert stack.gate.core.leases() == []


async def test_eviction_order_spares_what_is_not_needed(prod_stack):
    stack = prod_stack
    await load(stack.gate_url, "gemma3:12b")
    await ollama.AsyncClient(host=stack.gate_url).embed(model="bge-m3", input="x")
    await ollama.AsyncClient(host=stack.gate_url).generate(
        model="llama3.2:3b", prompt="x", options={"num_predict": 1}
    )  # benchmark class, 3,200 MiB: 1,918 MiB left
    started = []
    stack.gate.events.subscribe(
        lambda e: started.append(e.model) if e.kind is EventKind.EVICTION_STARTED else None
    )
    await load(stack.gate_url, "qwen2.5:7b", headers={"Authorization": "Bearer prod-token"})
    # Lowest class first: llama (benchmark) frees 3,200 -> 5,118 MiB, still short of 5,700;
    # then bge-m3 (background). gemma3 (interactive) stays.
    trail = stack.trail()
    assert started == ["llama3.2:3b", "bge-m3:latest"], trail
    assert sorted(m["name"] for m in await stack.ps()) == ["gemma3:12b", "qwen2.5:7b"], trail


async def stream_until_first_chunk(session, url, model):
    body = {"model": model, "prompt": "long", "options": {"num_predict": 100000}}
    response = await session.post(url + "/api/generate", json=body)
    await response.content.readline()
    return response


async def test_lower_class_waits_then_times_out_with_retry_after(prod_stack):
    stack = prod_stack
    await load(stack.gate_url, "gemma3:12b")
    async with aiohttp.ClientSession() as session:
        busy = await stream_until_first_chunk(session, stack.gate_url, "llama3.2:3b")
        headers = {"X-GPUGate-Priority": "background"}
        body = {"model": "qwen2.5:7b", "prompt": "x", "stream": False}
        queued = stack.next_event(EventKind.TICKET_QUEUED, model="qwen2.5:7b")
        waiting = asyncio.create_task(
            session.post(stack.gate_url + "/api/generate", json=body, headers=headers)
        )
        await queued
        # The consumer's queue holds one ticket: the next one is refused at once.
        embed = {"model": "bge-m3", "input": "x"}  # an embedding model: /api/embed
        async with session.post(stack.gate_url + "/api/embed", json=embed, headers=headers) as full:
            assert full.status == 503
            assert full.headers["X-GPUGate-Failure"] == "QUEUE_FULL"
            assert int(full.headers["Retry-After"]) >= 1
            assert (await full.json())["error"].startswith("QUEUE_FULL: bge-m3:latest needs")
        async with await waiting as timed_out:
            assert timed_out.status == 503
            assert timed_out.headers["X-GPUGate-Failure"] == "LEASE_TIMEOUT"
            assert int(timed_out.headers["Retry-After"]) >= 1
            message = (await timed_out.json())["error"]
        assert message.startswith("LEASE_TIMEOUT: qwen2.5:7b needs 5.6 GiB")
        assert "the most class background may wait" in message
        busy.close()
    assert [m["name"] for m in await stack.ps() if m["name"] == "qwen2.5:7b"] == []
    assert stack.gate.core.waiting() == []


async def test_lower_class_waits_and_is_served_when_the_blocker_finishes(prod_stack):
    stack = prod_stack
    await load(stack.gate_url, "gemma3:12b")
    async with aiohttp.ClientSession() as session:
        body = {"model": "llama3.2:3b", "prompt": "x", "options": {"num_predict": 2}}
        queued = stack.next_event(EventKind.TICKET_QUEUED, model="qwen2.5:7b")
        # llama (benchmark) is busy for ~0.5 s; qwen (interactive) waits for it to go idle.
        first = asyncio.create_task(session.post(stack.gate_url + "/api/generate", json=body))
        await stack.next_event(EventKind.LEASE_GRANTED, model="llama3.2:3b")
        second = asyncio.create_task(
            session.post(
                stack.gate_url + "/api/generate",
                json={"model": "qwen2.5:7b", "prompt": "x", "stream": False},
            )
        )
        await queued
        async with await first as resp:
            await resp.read()
        async with await second as resp:
            assert resp.status == 200
            assert float(resp.headers["X-GPUGate-Wait"]) > 0
    assert "qwen2.5:7b" in [m["name"] for m in await stack.ps()]
    assert stack.host.ooms() == []


async def test_a_model_that_can_never_fit_fails_at_once_with_the_budget(
    tmp_path, sim_host, fakenvml_path
):
    models = DEFAULT_MODELS_YAML + "gemma3:27b: {envelope: 17GiB}\n"
    async with running_stack(tmp_path, sim_host, fakenvml_path, models_yaml=models) as stack:
        async with (
            aiohttp.ClientSession() as session,
            session.post(
                stack.gate_url + "/v1/chat/completions",
                json={"model": "gemma3:27b", "messages": [{"role": "user", "content": "x"}]},
            ) as resp,
        ):
            assert resp.status == 503
            assert resp.headers["X-GPUGate-Failure"] == "INSUFFICIENT_SCHEDULABLE_VRAM"
            error = (await resp.json())["error"]
        assert error["code"] == "INSUFFICIENT_SCHEDULABLE_VRAM"
        assert error["message"].startswith(
            "INSUFFICIENT_SCHEDULABLE_VRAM: gemma3:27b needs 17.0 GiB, "
            "14.6 GiB schedulable on GPU 0"
        )
        assert stack.gate.core.leases() == []
