"""The simulated Ollama's retry after a load runs out of memory (server/sched.go `load`)."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import ollama
import pytest

from gpugate.core.units import GiB, MiB
from gpugate_sim.device import SimDevice, SimProcess, SimulatedGpuHost
from gpugate_sim.ollama import SimOllama
from gpugate_sim.ollama.oomretry import (
    is_out_of_memory,
    next_lower_auto_num_ctx,
    reduced_for_load_oom,
    retry_options,
)
from gpugate_sim.ollama.options import RequestOptions, RunnerOptions, parse_options, runner_size
from gpugate_sim.scenario import OllamaModelSpec, OllamaSpec
from gpugate_sim.shim import STATE_ENV
from tests.sim.test_sim_ollama_scheduler import external, make_sim, model

__all__ = ["external", "make_sim"]
QWEN = OllamaModelSpec(
    "qwen2.5:7b", load_seconds=0.02, family="qwen2", parameter_size="7.6B",
    context_length=32768, block_count=28, embedding_length=3584, feed_forward_length=18944,
    head_count=28, head_count_kv=4, vocab_size=152064,
)  # fmt: skip


def test_the_automatic_context_steps_down_to_32768_then_4096():
    assert [next_lower_auto_num_ctx(n) for n in (262144, 32769, 32768, 8192, 4097)] == [
        32768, 32768, 4096, 4096, 4096,
    ]  # fmt: skip
    assert next_lower_auto_num_ctx(4096) is None and next_lower_auto_num_ctx(2048) is None


def test_only_out_of_memory_errors_are_retried():
    assert is_out_of_memory("CUDA error: out of memory (GPU 0: pid 7 asked for 1 bytes, 0 free)")
    assert is_out_of_memory("ggml_backend_cuda_buffer_type_alloc_buffer: cudaMalloc failed")
    assert not is_out_of_memory("error loading model: simulated load failure")


@pytest.fixture
def big_card(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> SimulatedGpuHost:
    """A 24 GiB card: Ollama's automatic context there is 32768 (envconfig, by VRAM)."""
    host = SimulatedGpuHost.create(
        tmp_path / "gpu24", [SimDevice(0, 24 * GiB, 500 * MiB, "GPU-24", "NVIDIA RTX 4090")]
    )
    monkeypatch.setenv(STATE_ENV, str(host.state_path))
    return host


@pytest.fixture
async def qwen(big_card: SimulatedGpuHost) -> AsyncIterator[SimOllama]:
    sim = SimOllama(OllamaSpec(models=(QWEN,), tokens_per_second=5000.0), big_card)
    await sim.start("127.0.0.1", 0)
    yield sim
    await sim.close()
    assert [p for p in big_card.read().processes if p.name == "llama-server"] == []


async def test_a_load_oom_retries_once_with_the_next_lower_automatic_context(
    qwen: SimOllama, big_card: SimulatedGpuHost
):
    catalog = qwen.catalog.find("qwen2.5:7b")
    assert catalog is not None and catalog.auto_num_ctx
    auto = parse_options(catalog, {"num_gpu": 99})
    assert auto.num_ctx_auto and auto.runner.num_ctx == 32768
    reduced = reduced_for_load_oom(catalog, auto)
    assert reduced is not None and reduced.runner.num_ctx == 4096
    large = runner_size(catalog, auto.runner)
    small = runner_size(catalog, reduced.runner)
    assert small < large
    # Another program leaves room for the model at 4096 tokens, not at 32768.
    pid = os.getpid()
    big_card.add_process(SimProcess(0, pid, big_card.free(0) - (small + large) // 2, "C", "x"))
    try:
        async with ollama.AsyncClient(host=qwen.url) as client:
            # num_gpu asks for every layer on the GPU: no fit check, the runner OOMs.
            answer = await client.generate(model="qwen2.5:7b", prompt="x", options={"num_gpu": 99})
            assert answer.done
            state = qwen.state()
            runner = state.runner("qwen2.5:7b")
            assert runner is not None and runner.context_length == 4096
            assert runner.size == small
            assert (state.counters.oom_retries, state.counters.load_failures) == (1, 1)
            assert [oom.name for oom in big_card.ooms()] == ["llama-server"]
            # The next request with the automatic context is served by that runner.
            await client.generate(model="qwen2.5:7b", prompt="y", options={"num_gpu": 99})
            assert qwen.state().counters.loads == 1
    finally:
        big_card.release(pid)


async def test_a_context_the_request_set_is_not_lowered(
    qwen: SimOllama, big_card: SimulatedGpuHost
):
    catalog = qwen.catalog.find("qwen2.5:7b")
    assert catalog is not None
    pinned = parse_options(catalog, {"num_ctx": 32768, "num_gpu": 99})
    assert not pinned.num_ctx_auto and reduced_for_load_oom(catalog, pinned) is None
    large = runner_size(catalog, pinned.runner)
    pid = os.getpid()
    big_card.add_process(SimProcess(0, pid, big_card.free(0) - large // 2, "C", "x"))
    try:
        async with ollama.AsyncClient(host=qwen.url) as client:
            with pytest.raises(ollama.ResponseError) as caught:
                await client.generate(model="qwen2.5:7b", prompt="x", options=pinned_options())
        assert caught.value.status_code == 500
        assert "out of memory" in caught.value.error
        state = qwen.state()
        assert (state.counters.oom_retries, state.runners) == (0, ())
        assert len(big_card.ooms()) == 1
    finally:
        big_card.release(pid)


def pinned_options() -> dict[str, object]:
    return {"num_ctx": 32768, "num_gpu": 99}


async def test_a_load_oom_beside_other_models_evicts_them_all_and_retries_once(
    make_sim, sim_host: SimulatedGpuHost, external: Callable[[int], None]
):
    sim = await make_sim(model("small", 4 * GiB), model("huge", 6 * GiB, block_count=32))
    async with ollama.AsyncClient(host=sim.url) as client:
        await client.generate(model="small", prompt="x")
        external(8 * GiB)
        assert sim_host.free(0) < 6 * GiB < sim_host.free(0) + 4 * GiB
        answer = await client.generate(model="huge", prompt="x", options={"num_gpu": 99})
    assert answer.done
    state = sim.state()
    assert [r.model for r in state.runners] == ["huge:latest"]
    assert (state.counters.oom_retries, state.counters.unloads, state.counters.loads) == (1, 1, 2)
    assert len(sim_host.ooms()) == 1


async def test_a_second_load_oom_fails_the_request(
    make_sim, sim_host: SimulatedGpuHost, external: Callable[[int], None]
):
    sim = await make_sim(model("small", 4 * GiB), model("huge", 6 * GiB, block_count=32))
    async with ollama.AsyncClient(host=sim.url) as client:
        await client.generate(model="small", prompt="x")
        external(10 * GiB)
        assert sim_host.free(0) + 4 * GiB < 6 * GiB
        with pytest.raises(ollama.ResponseError) as caught:
            await client.generate(model="huge", prompt="x", options={"num_gpu": 99})
    assert caught.value.status_code == 500
    assert caught.value.error.startswith(
        "llama runner process has terminated: CUDA error: out of memory"
    )
    state = sim.state()
    # The other model was evicted for the retry, which ran out of memory as well.
    assert state.runners == ()
    assert (state.counters.oom_retries, state.counters.load_failures) == (1, 2)
    assert len(sim_host.ooms()) == 2


async def test_alone_with_nothing_to_lower_a_load_oom_fails_at_once(
    make_sim, sim_host: SimulatedGpuHost, external: Callable[[int], None]
):
    external(14 * GiB)
    sim = await make_sim(model("huge", 6 * GiB, block_count=32))
    async with ollama.AsyncClient(host=sim.url) as client:
        with pytest.raises(ollama.ResponseError):
            await client.generate(model="huge", prompt="x", options={"num_gpu": 99})
    assert (sim.state().counters.oom_retries, len(sim_host.ooms())) == (0, 1)


async def test_what_a_load_oom_is_retried_with(qwen: SimOllama):
    catalog = qwen.catalog.find("qwen2.5:7b")
    assert catalog is not None
    oom = "llama runner process has terminated: CUDA error: out of memory"
    auto = parse_options(catalog, None)
    lowered = retry_options(catalog, auto, oom, others_loaded=False)
    assert lowered is not None and lowered.runner.num_ctx == 4096
    pinned = parse_options(catalog, {"num_ctx": 32768})
    assert retry_options(catalog, pinned, oom, others_loaded=False) is None
    assert retry_options(catalog, pinned, oom, others_loaded=True) == pinned
    assert retry_options(catalog, auto, "error loading model: bad file", True) is None


async def test_request_options_record_whether_the_context_is_automatic(qwen: SimOllama):
    catalog = qwen.catalog.find("qwen2.5:7b")
    assert catalog is not None
    assert parse_options(catalog, None).num_ctx_auto
    assert not parse_options(catalog, {"num_ctx": 4096}).num_ctx_auto
    assert RequestOptions(RunnerOptions(num_ctx=4096)).num_ctx_auto is False
