"""A gate that cannot see its GPU grants nothing new, and sees again without a restart."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping

import aiohttp

from gpugate.gate.gate import Gate


async def post(url: str, path: str, body: dict) -> tuple[int, Mapping[str, str], dict]:
    async with aiohttp.ClientSession() as session, session.post(url + path, json=body) as resp:
        # case-insensitive: Go's net/http, as the gate speaks it before Ollama, writes
        # canonical names (X-Gpugate-Failure)
        return resp.status, resp.headers.copy(), await resp.json()


async def until(gate: Gate, seen: Callable[[], bool]) -> None:
    """Let the gate sample until `seen()` holds (each turn is one real NVML read)."""
    async with asyncio.timeout(15):
        while not seen():
            await gate.sampler.sample()


async def test_a_lost_gpu_fails_new_loads_and_the_gate_recovers_by_itself(stack):
    gate = stack.gate
    status, _, _ = await post(
        stack.gate_url, "/api/generate", {"model": "llama3.2:3b", "prompt": "x", "stream": False}
    )
    assert status == 200

    stack.host.lose(0)
    await until(gate, lambda: gate.core.fault is not None)

    status, headers, body = await post(
        stack.gate_url, "/api/generate", {"model": "qwen2.5:7b", "prompt": "x", "stream": False}
    )
    assert status == 503
    assert headers["X-GPUGate-Failure"] == "DRIVER_ERROR"
    assert float(headers["Retry-After"]) > 0
    assert body["error"].startswith("DRIVER_ERROR: ")
    assert "GpuIsLost" in body["error"]
    assert gate.core.leases() == [] and gate.core.waiting() == []
    assert [m["name"] for m in await stack.ps()] == ["llama3.2:3b"]

    # A model already resident needs no memory: it is still served.
    status, _, _ = await post(
        stack.gate_url, "/api/generate", {"model": "llama3.2:3b", "prompt": "x", "stream": False}
    )
    assert status == 200

    stack.host.clear_injections()
    await until(gate, lambda: gate.core.fault is None)

    status, headers, body = await post(
        stack.gate_url, "/api/generate", {"model": "qwen2.5:7b", "prompt": "x", "stream": False}
    )
    assert status == 200, body
    assert "X-GPUGate-Failure" not in headers
    assert gate.core.leases() == [] and gate.core.waiting() == []
    assert sorted(m["name"] for m in await stack.ps()) == ["llama3.2:3b", "qwen2.5:7b"]
