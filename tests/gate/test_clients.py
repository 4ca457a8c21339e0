"""The official clients get through the gate exactly what they get from Ollama directly.

Each exchange runs twice, once against the simulated Ollama and once through the gate,
and the parsed results are compared field by field, apart from clocks and durations.
"""

from __future__ import annotations

from typing import Any

import ollama
import openai
import pytest

TIMING = {
    "created_at",
    "total_duration",
    "load_duration",
    "prompt_eval_duration",
    "eval_duration",
    "expires_at",
    "created",
    "id",
    "system_fingerprint",
    "modified_at",
}


def normal(value: Any) -> Any:
    """A result without the fields that differ between any two runs (clocks, ids)."""
    if hasattr(value, "model_dump"):
        value = value.model_dump()
    if isinstance(value, dict):
        return {k: normal(v) for k, v in value.items() if k not in TIMING}
    if isinstance(value, list):
        return [normal(v) for v in value]
    return value


async def both(stack, call):
    direct = await call(ollama.AsyncClient(host=stack.sim_url))
    gated = await call(ollama.AsyncClient(host=stack.gate_url))
    return direct, gated


async def collect(stream):
    return [part async for part in stream]


@pytest.mark.parametrize(
    "call",
    [
        pytest.param(
            lambda c: c.generate(
                model="llama3.2:3b", prompt="why is the sky blue", options={"num_predict": 12}
            ),
            id="generate",
        ),
        pytest.param(
            lambda c: c.chat(
                model="llama3.2:3b",
                options={"num_predict": 12},
                messages=[{"role": "user", "content": "hi"}],
            ),
            id="chat",
        ),
        pytest.param(lambda c: c.embed(model="bge-m3", input=["one", "two"]), id="embed"),
        pytest.param(lambda c: c.embeddings(model="bge-m3", prompt="one"), id="embeddings"),
    ],
)
async def test_non_streaming_calls_match(stack, call):
    direct, gated = await both(stack, call)
    assert normal(gated) == normal(direct)


@pytest.mark.parametrize(
    "call",
    [
        pytest.param(
            lambda c: c.generate(
                model="llama3.2:3b", prompt="count", stream=True, options={"num_predict": 16}
            ),
            id="generate",
        ),
        pytest.param(
            lambda c: c.chat(
                model="llama3.2:3b",
                stream=True,
                options={"num_predict": 16},
                messages=[{"role": "user", "content": "hi"}],
            ),
            id="chat",
        ),
    ],
)
async def test_streaming_calls_match_chunk_for_chunk(stack, call):
    direct = await collect(await call(ollama.AsyncClient(host=stack.sim_url)))
    gated = await collect(await call(ollama.AsyncClient(host=stack.gate_url)))
    assert len(gated) == len(direct) > 2
    assert [normal(p) for p in gated] == [normal(p) for p in direct]


async def test_listing_calls_match(stack):
    client = ollama.AsyncClient(host=stack.gate_url)
    await client.generate(model="llama3.2:3b", prompt="warm up", options={"num_predict": 1})
    for call in (
        lambda c: c.ps(),
        lambda c: c.list(),
        lambda c: c.show("gemma3:12b"),
    ):
        direct, gated = await both(stack, call)
        assert normal(gated) == normal(direct)
    ps = await client.ps()
    assert [m.model for m in ps.models] == ["llama3.2:3b"]


async def test_pull_progress_stream_matches(stack):
    direct = await collect(await ollama.AsyncClient(host=stack.sim_url).pull("bge-m3", stream=True))
    gated = await collect(await ollama.AsyncClient(host=stack.gate_url).pull("bge-m3", stream=True))
    assert [normal(p) for p in gated] == [normal(p) for p in direct]
    assert gated[-1].status == "success"


async def test_unknown_model_error_is_ollamas_own(stack):
    errors = []
    for url in (stack.sim_url, stack.gate_url):
        with pytest.raises(ollama.ResponseError) as caught:
            await ollama.AsyncClient(host=url).generate(model="no-such-model", prompt="x")
        errors.append((caught.value.status_code, caught.value.error))
    assert errors[0] == errors[1]
    assert errors[0][0] == 404
    assert stack.gate.core.leases() == []


def openai_client(url: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=url + "/v1", api_key="ollama", max_retries=0)


async def test_openai_chat_embeddings_models_match(stack):
    results = []
    for url in (stack.sim_url, stack.gate_url):
        client = openai_client(url)
        chat = await client.chat.completions.create(
            model="llama3.2:3b", max_tokens=8, messages=[{"role": "user", "content": "hi"}]
        )
        stream = await client.chat.completions.create(
            model="llama3.2:3b",
            max_tokens=8,
            stream=True,
            messages=[{"role": "user", "content": "hi"}],
        )
        chunks = [chunk async for chunk in stream]
        embeddings = await client.embeddings.create(model="bge-m3", input=["a", "b"])
        models = await client.models.list()
        results.append(
            (
                normal(chat),
                [normal(c) for c in chunks],
                normal(embeddings),
                sorted(m.id for m in models.data),
            )
        )
        await client.close()
    assert results[1] == results[0]
    assert len(results[0][1]) > 2


async def test_openai_unknown_model_error_matches(stack):
    seen = []
    for url in (stack.sim_url, stack.gate_url):
        client = openai_client(url)
        with pytest.raises(openai.NotFoundError) as caught:
            await client.chat.completions.create(
                model="no-such-model", messages=[{"role": "user", "content": "hi"}]
            )
        seen.append((caught.value.status_code, caught.value.body))
        await client.close()
    assert seen[1] == seen[0]
