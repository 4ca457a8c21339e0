"""Refusals Ollama decides from the model, not the body: the gate asks Ollama what the model
is (/api/show, /api/tags) and forwards such a request unleased, for Ollama to word its refusal;
nobody's model is evicted for it."""

from __future__ import annotations

import json

import aiohttp
import pytest

from gpugate.gate.exchange import LEASE_HEADER
from tests.gate.harness import running_stack

HOST = {"Host": "localhost:11434"}


@pytest.fixture
async def stack(tmp_path, sim_host, fakenvml_path):
    async with running_stack(tmp_path, sim_host, fakenvml_path) as stack:
        yield stack


async def send(session, url, path, body):
    async with session.post(url + path, data=json.dumps(body).encode(), headers=HOST) as resp:
        return resp.status, await resp.read(), resp.headers.get(LEASE_HEADER)


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/api/generate", {"model": "bge-m3", "prompt": "hi", "stream": False}),
        ("/api/chat", {"model": "bge-m3", "messages": [{"role": "user", "content": "hi"}]}),
        (
            "/v1/chat/completions",
            {"model": "bge-m3", "messages": [{"role": "user", "content": "x"}]},
        ),
        ("/api/embeddings", {"model": "BGE-M3", "prompt": "hi"}),
    ],
)
async def test_a_request_the_model_refuses_is_forwarded_unleased(stack, path, body):
    async with aiohttp.ClientSession() as session:
        gated = await send(session, stack.gate_url, path, body)
        direct = await send(session, stack.sim_url, path, body)
    assert gated[:2] == direct[:2]
    assert gated[0] in (400, 404)
    assert gated[2] is None
    assert stack.gate.core.leases() == []
    assert await stack.ps() == []


async def test_a_request_the_model_serves_is_leased(stack):
    async with aiohttp.ClientSession() as session:
        status, _, lease = await send(
            session, stack.gate_url, "/api/embeddings", {"model": "bge-m3", "prompt": "hi"}
        )
    assert (status, lease is not None) == (200, True)
