"""The gate's own calls to a runtime are bounded and classified: a hung unload or sizing
call is TIMEOUT, a refused one RUNTIME_CRASH, and neither waits out a request's deadline."""

from __future__ import annotations

import asyncio

import aiohttp
import ollama
import pytest

from gpugate.core.classes import PriorityClass, ResidencyPolicy
from gpugate.core.effects import EventKind
from gpugate.core.failures import FailureClass
from gpugate.core.residents import ResidentKey
from gpugate.core.tickets import Demand
from gpugate.core.units import MiB
from gpugate.gate.gate import GateFailure
from gpugate.runtimes.footprint import Cards
from tests.gate.fakes import FakeGpu, FakeUpstream, Mode, fake_gate
from tests.gate.harness import running_stack
from tests.gate.test_eviction import IDENTITIES, SLOW_MODELS

SIZES = {"gemma3:12b": 7796 * MiB, "bge-m3:latest": 2012 * MiB, "llama3.2:3b": 3200 * MiB}
PIDS = {"gemma3:12b": 100, "bge-m3:latest": 101, "llama3.2:3b": 102}


def three_loaded() -> tuple[FakeUpstream, FakeGpu]:
    """gemma3 (interactive), bge-m3 (background), llama3.2 (benchmark), loaded out of band."""
    upstream = FakeUpstream(loaded=dict(SIZES))
    gpu = FakeGpu(held={PIDS[m]: n for m, n in SIZES.items()})
    return upstream, gpu


def qwen(model: str = "qwen2.5:7b", envelope: int = 5700 * MiB) -> Demand:
    return Demand(
        key=ResidentKey("ollama", model, ""),
        gpu=0,
        envelope=envelope,
        priority=PriorityClass.PRODUCTION,
        resident_priority=PriorityClass.INTERACTIVE,
        policy=ResidencyPolicy.KEEP_WARM,
        idle_ttl=900.0,
    )


async def listed(fakes, count: int) -> None:
    while len(fakes.gate.core.residents()) < count:
        await fakes.gate.events.next(lambda e: e.kind is EventKind.OUT_OF_BAND_RESIDENT)


async def test_a_hung_unload_fails_its_ticket_as_timeout_at_the_control_bound(tmp_path):
    upstream, gpu = three_loaded()
    upstream.unload_mode = Mode.HANG
    async with fake_gate(tmp_path, upstream=upstream, gpu=gpu) as fakes:
        await asyncio.wait_for(listed(fakes, 3), 5)
        started = fakes.gate.clock()
        with pytest.raises(GateFailure) as failed:
            await asyncio.wait_for(fakes.gate.leases.acquire(qwen()), 5)
        assert failed.value.failure.failure_class is FailureClass.TIMEOUT
        assert failed.value.failure.failure_class.http_status == 504
        assert "did not answer within 0.2s" in failed.value.failure.message
        assert fakes.gate.clock() - started < 2.0
        assert fakes.gate.core.leases() == [] and fakes.gate.core.waiting() == []


async def test_a_hung_sizing_call_is_a_timeout(tmp_path):
    upstream = FakeUpstream(show_mode=Mode.HANG)
    async with fake_gate(tmp_path, upstream=upstream) as fakes:
        link = fakes.gate.links["ollama"]
        assert link.session is not None
        sizing = fakes.gate.envelopes.envelope(
            link.consumer, link.runtime.memory, link.session, "mistral:7b", "", Cards()
        )
        with pytest.raises(GateFailure) as failed:
            await asyncio.wait_for(sizing, 5)
        assert failed.value.failure.failure_class is FailureClass.TIMEOUT
        assert failed.value.failure.message.startswith("TIMEOUT: cannot size mistral:7b")


async def test_one_unload_is_not_verified_by_the_memory_another_gave_back(tmp_path):
    upstream, gpu = three_loaded()
    # llama's runner exits at once; bge-m3's keeps its memory.
    upstream.on_unload = lambda model: gpu.held.pop(PIDS[model]) if model == "llama3.2:3b" else None
    async with fake_gate(tmp_path, upstream=upstream, gpu=gpu) as fakes:
        await asyncio.wait_for(listed(fakes, 3), 5)
        started, done = [], {}
        fakes.gate.events.subscribe(
            lambda e: started.append(e.model) if e.kind is EventKind.EVICTION_STARTED else None
        )
        fakes.gate.events.subscribe(
            lambda e: (
                done.update({e.model: e.detail.partition(";")[0]})
                if e.kind is EventKind.EVICTION_DONE
                else None
            )
        )
        with pytest.raises(GateFailure) as failed:
            await asyncio.wait_for(fakes.gate.leases.acquire(qwen()), 5)
        assert failed.value.failure.failure_class is FailureClass.GPU_MEMORY_NOT_RECLAIMED
        assert started == ["llama3.2:3b", "bge-m3:latest"]
        assert done == {"llama3.2:3b": "reclaimed", "bge-m3:latest": "not reclaimed"}
        assert fakes.gate.core.leases() == [] and fakes.gate.core.waiting() == []


async def test_a_stopped_runtime_is_runtime_crash_not_memory_not_reclaimed(
    tmp_path, sim_host, fakenvml_path
):
    async with running_stack(
        tmp_path,
        sim_host,
        fakenvml_path,
        extra=IDENTITIES,
        models_yaml=SLOW_MODELS,
    ) as stack:
        client = ollama.AsyncClient(host=stack.gate_url)
        await client.generate(model="gemma3:12b", prompt="x", options={"num_predict": 1})
        await client.embed(model="bge-m3", input="x")
        await client.generate(model="llama3.2:3b", prompt="x", options={"num_predict": 1})
        await stack.sim.close()
        # qwen needs llama and bge-m3 evicted: the unloads meet a refused connection.
        headers = {"Authorization": "Bearer prod-token"}
        body = {"model": "qwen2.5:7b", "prompt": "x", "stream": False}
        async with (
            aiohttp.ClientSession() as session,
            session.post(stack.gate_url + "/api/generate", json=body, headers=headers) as resp,
        ):
            assert resp.status == 502, await resp.text()
            assert resp.headers["X-GPUGate-Failure"] == "RUNTIME_CRASH"
            error = (await resp.json())["error"]
        assert error.startswith("RUNTIME_CRASH: ")
        assert "GPU_MEMORY_NOT_RECLAIMED" not in error
        assert stack.gate.core.leases() == [] and stack.gate.core.waiting() == []
