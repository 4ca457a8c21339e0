"""vLLM behind the gate: an eviction is a sleep, a request that finds it asleep wakes it
under a lease, and what it keeps asleep stays counted (the simulated vLLM on the simulated
card, read through the real pynvml over the fake library)."""

from __future__ import annotations

import asyncio
import contextlib
import textwrap
from collections.abc import AsyncIterator

import aiohttp
import ollama
import openai
import pytest

from gpugate.core.effects import EventKind
from gpugate.core.lifecycle import LifeReport
from gpugate.core.residents import ResidentKey, ResidentState
from gpugate.core.units import GiB, MiB
from gpugate.gate.process_absent import PROCESS_HEADER
from gpugate_sim.vllm import SimVllm, VllmServerSpec
from tests.gate.harness import Stack, running_stack
from tests.ports import free_ports

CONTEXT, OVERHEAD, WEIGHTS = 500 * MiB, 512 * MiB, 1200 * MiB
RESIDUAL = CONTEXT + OVERHEAD
AWAKE = 8 * GiB
"""gpu_memory_utilization 0.5 of the 16 GiB card."""
KEY = ResidentKey("vllm", "qwen")


def vllm_spec() -> VllmServerSpec:
    return VllmServerSpec(
        listen="127.0.0.1:0",
        served_model_names=("qwen",),
        gpu_memory_utilization=0.5,
        enable_sleep_mode=True,
        dev_mode=True,
        context=CONTEXT,
        overhead=OVERHEAD,
        weights=WEIGHTS,
        tokens_per_second=2000.0,
    )


def consumer_yaml(listen: int, upstream: str, level: int) -> str:
    return textwrap.indent(
        textwrap.dedent(f"""\
          vllm:
            runtime: vllm
            listen: 127.0.0.1:{listen}
            upstream: {upstream}
            class: background
            residency: {{policy: keep_warm, ttl: 10m}}
            envelope: {(AWAKE - RESIDUAL) // MiB}MiB
            sleep_level: {level}
            processes: {{names: [vllm]}}
            models:
              qwen: {{envelope: {(AWAKE - RESIDUAL) // MiB}MiB}}
        """),
        "  ",
    )


@contextlib.asynccontextmanager
async def vllm_stack(
    tmp_path, sim_host, fakenvml_path, *, level: int = 1, asleep: bool = False
) -> AsyncIterator[tuple[Stack, SimVllm, str]]:
    sim = SimVllm(vllm_spec(), sim_host.directory)
    await asyncio.to_thread(sim.start)
    try:
        assert sim.url is not None
        if asleep:
            async with (
                aiohttp.ClientSession() as session,
                session.post(sim.url + "/sleep?level=1") as resp,
            ):
                assert resp.status == 200
        (listen,) = free_ports(1)
        extra = consumer_yaml(listen, sim.url, level)
        async with running_stack(tmp_path, sim_host, fakenvml_path, extra=extra) as stack:
            yield stack, sim, f"http://127.0.0.1:{listen}"
    finally:
        await asyncio.to_thread(sim.stop)


async def sleeping(sim: SimVllm) -> bool:
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"{sim.url}/is_sleeping") as resp,
    ):
        return bool((await resp.json())["is_sleeping"])


async def until(condition, timeout: float = 20.0) -> None:  # type: ignore[no-untyped-def]
    async with asyncio.timeout(timeout):
        while not condition():
            await asyncio.sleep(0.02)


async def test_an_awake_vllm_is_adopted_and_evicted_by_a_sleep(tmp_path, sim_host, fakenvml_path):
    async with vllm_stack(tmp_path, sim_host, fakenvml_path) as (stack, sim, _):
        gate = stack.gate
        # Awake at the gate's start: adopted as a resident, counted from NVML.
        await until(lambda: gate.core.resident(KEY) is not None)
        await until(lambda: gate.core.budget(0).consumer("vllm").committed >= AWAKE)
        evicted = stack.next_event(EventKind.EVICTION_DONE, key=KEY)
        # gemma3:12b (7.6 GiB, interactive) fits only if the idle background vLLM sleeps.
        answer = await ollama.AsyncClient(host=stack.gate_url).generate("gemma3:12b", "hi")
        assert answer.done
        event = await evicted
        assert event.reason == "eviction" and event.detail.startswith("reclaimed")
        assert await sleeping(sim)
        # Asleep it keeps its CUDA context: still counted for the consumer, as NVML shows.
        assert sim_host.read().held_by(sim.pid, 0) == RESIDUAL
        await until(lambda: gate.core.budget(0).consumer("vllm").committed == RESIDUAL)
        assert gate.core.resident(KEY) is None
        assert gate.core.leases() == [] and stack.host.ooms() == []


@pytest.mark.parametrize("level", [1, 2])
async def test_a_request_wakes_a_sleeping_vllm_under_a_lease(
    tmp_path, sim_host, fakenvml_path, level
):
    async with vllm_stack(tmp_path, sim_host, fakenvml_path, level=level) as (stack, sim, url):
        gate = stack.gate
        await until(lambda: gate.core.resident(KEY) is not None)
        done = stack.next_event(EventKind.EVICTION_DONE, key=KEY)
        gate.evict(KEY, who="test")
        await done
        assert await sleeping(sim)
        # Its lifecycle is the core's: asleep, in the status document and the metrics.
        assert await lifecycle_state(stack) == ("asleep", 1.0)
        granted = stack.next_event(EventKind.LEASE_GRANTED, key=KEY)
        client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="x", max_retries=0)
        chat = await client.chat.completions.create(
            model="qwen", messages=[{"role": "user", "content": "hi"}], max_tokens=4
        )
        # A level-2 sleep dropped the weights: the wake loaded them again, so it answers
        # words, not the "!" of an engine without weights.
        assert chat.choices[0].message.content and "!" not in chat.choices[0].message.content
        lease = await granted
        assert lease.bytes == AWAKE - RESIDUAL
        assert not await sleeping(sim)
        resident = gate.core.resident(KEY)
        assert resident is not None and resident.state is ResidentState.RESIDENT
        assert sim_host.read().held_by(sim.pid, 0) == AWAKE
        assert await lifecycle_state(stack) == ("up", 1.0)
        assert gate.core.leases() == [] and stack.host.ooms() == []


async def lifecycle_state(stack: Stack) -> tuple[str, float]:
    """The consumer's lifecycle state as /gate/v1/status says, and its metric's value."""
    async with aiohttp.ClientSession() as session:
        async with session.get(stack.control_url + "/gate/v1/status") as resp:
            document = await resp.json()
        async with session.get(stack.control_url + "/metrics") as resp:
            metrics = await resp.text()
    (entry,) = [c for c in document["consumers"] if c["consumer"] == "vllm"]
    state = entry["lifecycle"]["state"]
    sample = f'gpugate_runtime_state{{consumer="vllm",state="{state}"}} '
    (line,) = [x for x in metrics.splitlines() if x.startswith(sample)]
    return state, float(line.split()[-1])


async def test_the_gates_refusal_is_in_vllms_error_shape(tmp_path, sim_host, fakenvml_path):
    async with vllm_stack(tmp_path, sim_host, fakenvml_path) as (stack, _sim, url):
        gate = stack.gate
        await until(lambda: gate.core.resident(KEY) is not None)
        gate.drain("vllm", who="test")
        client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="x", max_retries=0)
        with pytest.raises(openai.APIStatusError) as caught:
            await client.chat.completions.create(
                model="qwen", messages=[{"role": "user", "content": "hi"}], max_tokens=4
            )
        body = caught.value.body
        assert isinstance(body, dict) and body["code"] == caught.value.status_code
        assert set(body) == {"message", "type", "param", "code"}
        assert gate.core.leases() == []


async def test_a_vllm_the_books_lost_is_still_asked_itself_never_stood_in_for(
    tmp_path, sim_host, fakenvml_path
):
    # The gate neither starts nor stops vLLM's server: whatever its lifecycle says, a read
    # goes to vLLM, which answers it (asleep too); the gate answers nothing in its place.
    async with vllm_stack(tmp_path, sim_host, fakenvml_path) as (stack, _sim, url):
        gate = stack.gate
        await until(lambda: gate.core.resident(KEY) is not None)
        gate.life_report("vllm", LifeReport.FOUND_STOPPED)
        granted = []
        gate.events.subscribe(
            lambda e: e.kind is EventKind.LEASE_GRANTED and granted.append(e), routine=True
        )
        async with aiohttp.ClientSession() as session:
            for path in ("/health", "/v1/models"):
                async with session.get(url + path) as resp:
                    await resp.read()
                    assert resp.status == 200
                    assert PROCESS_HEADER not in resp.headers, "vLLM's own answer"
        assert granted == []
