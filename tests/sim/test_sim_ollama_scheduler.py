"""The simulated Ollama's scheduler: runner processes, reloads, eviction, offload, failures."""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import aiohttp
import ollama
import openai
import pytest

from gpugate.core.units import GiB, MiB
from gpugate_sim.device import SimProcess, SimulatedGpuHost
from gpugate_sim.ollama import SimOllama
from gpugate_sim.ollama import runner as runner_main
from gpugate_sim.ollama.engine import plan
from gpugate_sim.ollama.state import RunnerInfo, RunnerPhase, SimState
from gpugate_sim.scenario import OllamaModelSpec, OllamaSpec, PreloadSpec

FAST = 0.02
MakeSim = Callable[..., Awaitable[SimOllama]]


def model(name: str, size: int, **fields: object) -> OllamaModelSpec:
    fields.setdefault("load_seconds", FAST)
    return OllamaModelSpec(name, size=size, **fields)  # type: ignore[arg-type]


@pytest.fixture
async def make_sim(sim_host: SimulatedGpuHost) -> AsyncIterator[MakeSim]:
    """Start SimOllama servers on free ports; on teardown, check no runner survives."""
    started: list[SimOllama] = []

    async def make(*models: OllamaModelSpec, **fields: object) -> SimOllama:
        fields.setdefault("tokens_per_second", 5000.0)
        sim = SimOllama(OllamaSpec(models=models, **fields), sim_host)  # type: ignore[arg-type]
        await sim.start("127.0.0.1", 0)
        started.append(sim)
        return sim

    yield make
    for sim in started:
        pids = [r.pid for r in sim.state().runners if r.pid is not None]
        await sim.close()
        assert [pid for pid in pids if Path(f"/proc/{pid}").exists()] == []
    assert [p for p in sim_host.read().processes if p.name == "llama-server"] == []


@pytest.fixture
def external(sim_host: SimulatedGpuHost) -> Callable[[int], None]:
    """Make another process (this test process) hold VRAM, like Plex or whisper would."""
    pid = os.getpid()

    def hold(nbytes: int) -> None:
        sim_host.add_process(SimProcess(0, pid, nbytes, "C", "Plex Transcoder"))

    yield hold
    sim_host.release(pid)


def runner_of(state: SimState, name: str) -> RunnerInfo:
    runner = state.runner(name)
    assert runner is not None, f"{name} is not loaded: {state.runners}"
    return runner


def long_prompt(tokens: int) -> str:
    """A prompt whose deterministic answer has at least `tokens` tokens."""
    return next(p for p in (f"story {i}" for i in range(1000)) if len(plan(p, -1).tokens) >= tokens)


def phase(state: SimState, name: str) -> RunnerPhase | None:
    runner = state.runner(name)
    return None if runner is None else runner.phase


def proc_alive(pid: int | None) -> bool:
    return pid is not None and Path(f"/proc/{pid}").exists()


async def generate(sim: SimOllama, **body: object) -> dict[str, object]:
    async with ollama.AsyncClient(host=sim.url) as client:
        response = await client.generate(**body)  # type: ignore[arg-type]
    return response.model_dump()


# -- runner processes ------------------------------------------------------------------


async def test_runner_is_a_real_child_process_holding_vram(
    make_sim: MakeSim, sim_host: SimulatedGpuHost
) -> None:
    sim = await make_sim(model("qwen2.5:7b", 5 * GiB))
    await generate(sim, model="qwen2.5:7b", keep_alive=-1)
    runner = runner_of(sim.state(), "qwen2.5:7b")
    assert runner.pid is not None and proc_alive(runner.pid)
    argv = Path(f"/proc/{runner.pid}/cmdline").read_bytes().split(b"\0")
    assert b"llama-server" in argv and b"--model" in argv
    blob = argv[argv.index(b"--model") + 1].decode()
    assert Path(blob).name.startswith("sha256-")
    assert Path(f"/proc/{runner.pid}/comm").read_text().strip() == "llama-server"
    stat = Path(f"/proc/{runner.pid}/stat").read_text()
    assert int(stat.rsplit(")", 1)[1].split()[1]) == os.getpid()  # parent: the server
    assert sim_host.read().held_by(runner.pid, 0) == 5 * GiB
    await sim.close()
    assert not proc_alive(runner.pid)
    assert sim_host.read().held_by(runner.pid, 0) == 0


def test_runner_fills_its_vram_in_steps_while_loading(
    monkeypatch: pytest.MonkeyPatch, sim_host: SimulatedGpuHost
) -> None:
    steps: list[int] = []

    def allocate(pid: int, nbytes: int, *, gpu: int = 0, kind: str = "C", name: str = "") -> int:
        assert (pid, gpu, name) == (os.getpid(), 0, "llama-server")
        steps.append(nbytes)
        return sum(steps)

    monkeypatch.setattr(sim_host, "allocate", allocate)
    runner_main._load(sim_host, 0, 10 * GiB + 3, 0.0, "llama-server")
    assert len(steps) == runner_main.LOAD_STEPS > 1
    assert sum(steps) == 10 * GiB + 3 and all(step > 0 for step in steps)


async def test_option_change_reloads_the_runner_with_a_new_size(make_sim: MakeSim) -> None:
    kv = 128 * 1024
    sim = await make_sim(model("llama3.1:8b", 5 * GiB, kv_bytes_per_token=kv))
    await generate(sim, model="llama3.1:8b", prompt="a")
    first = runner_of(sim.state(), "llama3.1:8b")
    await generate(sim, model="llama3.1:8b", prompt="b", options={"temperature": 0.1})
    assert runner_of(sim.state(), "llama3.1:8b").pid == first.pid  # not a runner option
    await generate(sim, model="llama3.1:8b", prompt="c", options={"num_ctx": 8192})
    second = runner_of(sim.state(), "llama3.1:8b")
    assert second.pid != first.pid and not proc_alive(first.pid)
    assert second.size == first.size + (8192 - 4096) * kv
    assert (second.options.num_ctx, second.context_length) == (8192, 8192)
    counters = sim.state().counters
    assert (counters.loads, counters.unloads) == (2, 1)
    # num_ctx above the training context is capped; below 4 it becomes 4.
    await generate(sim, model="llama3.1:8b", options={"num_ctx": 100_000})
    assert runner_of(sim.state(), "llama3.1:8b").context_length == 8192
    await generate(sim, model="llama3.1:8b", options={"num_ctx": 1})
    assert runner_of(sim.state(), "llama3.1:8b").context_length == 4


async def test_partial_offload_when_the_gpu_is_short(
    make_sim: MakeSim, sim_host: SimulatedGpuHost, external: Callable[[int], None]
) -> None:
    external(12 * GiB)
    free = sim_host.free(0)
    sim = await make_sim(model("gemma3:12b", 8 * GiB), fit_margin=256 * MiB)
    async with ollama.AsyncClient(host=sim.url) as client:
        answer = await client.generate(model="gemma3:12b", prompt="hi")
        (entry,) = (await client.ps()).models
    assert answer.done
    assert entry.size == 8 * GiB
    assert entry.size_vram == free - 256 * MiB < entry.size
    runner = runner_of(sim.state(), "gemma3:12b")
    assert sim_host.read().held_by(runner.pid, 0) == entry.size_vram
    assert sim_host.ooms() == []


async def test_num_gpu_zero_runs_on_the_cpu_only(
    make_sim: MakeSim, sim_host: SimulatedGpuHost
) -> None:
    sim = await make_sim(model("phi3", 2 * GiB))
    await generate(sim, model="phi3", prompt="x", options={"num_gpu": 0})
    runner = runner_of(sim.state(), "phi3:latest")
    assert (runner.size, runner.size_vram) == (2 * GiB, 0)
    assert proc_alive(runner.pid) and sim_host.read().held_by(runner.pid, 0) == 0


async def test_idle_runner_is_evicted_for_a_model_that_does_not_fit(
    make_sim: MakeSim, sim_host: SimulatedGpuHost
) -> None:
    sim = await make_sim(model("alpha", 9 * GiB), model("beta", 9 * GiB))
    await generate(sim, model="alpha", keep_alive="1h")
    alpha = runner_of(sim.state(), "alpha:latest")
    await generate(sim, model="beta", prompt="x")
    state = sim.state()
    assert state.runner("alpha:latest") is None and not proc_alive(alpha.pid)
    beta = runner_of(state, "beta:latest")
    assert beta.size_vram == beta.size == 9 * GiB
    assert sim_host.read().held_by(beta.pid, 0) == 9 * GiB
    assert (state.counters.loads, state.counters.unloads) == (2, 1)


async def test_eviction_takes_the_shortest_keep_alive_first(make_sim: MakeSim) -> None:
    sim = await make_sim(model("long", 5 * GiB), model("short", 5 * GiB), model("big", 9 * GiB))
    await generate(sim, model="long", keep_alive="1h")
    await generate(sim, model="short", keep_alive="10m")
    await generate(sim, model="big")
    state = sim.state()
    assert {r.model for r in state.ready()} == {"long:latest", "big:latest"}


async def test_a_load_waits_out_an_unload_under_way_instead_of_evicting_another(
    make_sim: MakeSim, sim_host: SimulatedGpuHost
) -> None:
    # Ollama holds loadedMu from an unload's Kill to its delete from s.loaded: a load never
    # plans beside a runner whose memory is back but which is still listed.
    sim = await make_sim(model("keep", 7 * GiB), model("going", 6 * GiB), model("new", 6 * GiB))
    sim.scheduler.faults.reap_seconds = 0.5  # memory back, still listed, for half a second
    await generate(sim, model="keep", keep_alive="1h")
    keep = runner_of(sim.state(), "keep:latest")
    await generate(sim, model="going", prompt="x", keep_alive=0)
    await sim.wait_until(lambda s: phase(s, "going:latest") is RunnerPhase.UNLOADING)
    await generate(sim, model="new", prompt="x")
    state = sim.state()
    assert {r.model for r in state.ready()} == {"keep:latest", "new:latest"}
    assert runner_of(state, "keep:latest").pid == keep.pid and proc_alive(keep.pid)
    assert (state.counters.loads, state.counters.unloads) == (3, 1)


async def test_max_loaded_models_evicts_even_when_memory_is_free(make_sim: MakeSim) -> None:
    sim = await make_sim(model("one", 1 * GiB), model("two", 1 * GiB), max_loaded_models=1)
    await generate(sim, model="one")
    await generate(sim, model="two")
    assert [r.model for r in sim.state().ready()] == ["two:latest"]


async def test_busy_runner_is_evicted_only_after_its_request_ends(make_sim: MakeSim) -> None:
    sim = await make_sim(model("busy", 9 * GiB, tokens_per_second=40.0), model("next", 9 * GiB))
    async with ollama.AsyncClient(host=sim.url) as client:
        stream = await client.generate(model="busy", prompt=long_prompt(20), stream=True)
        first = await anext(stream)
        assert not first.done
        waiting = asyncio.create_task(client.generate(model="next", prompt="x"))
        state = await sim.wait_until(lambda s: runner_of(s, "busy:latest").draining)
        assert runner_of(state, "busy:latest").refcount == 1
        assert state.runner("next:latest") is None and not waiting.done()
        rest = [part async for part in stream]
        assert rest[-1].done and rest[-1].done_reason == "stop"
        assert (await waiting).done
    state = sim.state()
    assert state.counters.generations_cancelled == 0
    assert state.counters.generations_completed == 2
    assert [r.model for r in state.ready()] == ["next:latest"]


async def test_requests_beyond_num_parallel_wait_for_a_slot(make_sim: MakeSim) -> None:
    sim = await make_sim(model("solo", 1 * GiB, tokens_per_second=40.0), num_parallel=1)
    await generate(sim, model="solo")
    async with ollama.AsyncClient(host=sim.url) as client:
        both = asyncio.gather(
            client.generate(model="solo", prompt=long_prompt(20)),
            client.generate(model="solo", prompt=long_prompt(20)),
        )
        state = await sim.wait_until(
            lambda s: s.counters.requests_in_flight == 2 and s.counters.generations_started == 1
        )
        assert runner_of(state, "solo:latest").refcount == 2
        answers = await both
    assert all(a.done_reason == "stop" for a in answers)
    assert sim.state().counters.generations_completed == 2


# -- failures --------------------------------------------------------------------------


async def test_mid_stream_error_on_the_api_routes(make_sim: MakeSim) -> None:
    sim = await make_sim(model("flaky", 1 * GiB))
    fail = {"sim_fail_after_tokens": 3}
    async with ollama.AsyncClient(host=sim.url) as client:
        seen = []
        with pytest.raises(ollama.ResponseError) as caught:
            async for part in await client.chat(
                model="flaky",
                messages=[{"role": "user", "content": "x"}],
                options=fail,
                stream=True,
            ):
                seen.append(part)
        assert len(seen) == 3 and caught.value.status_code == -1
        assert "error was encountered while running the model" in caught.value.error
        with pytest.raises(ollama.ResponseError) as whole:
            await client.generate(model="flaky", prompt="x", options=fail)
        assert whole.value.status_code == 500
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            f"{sim.url}/api/generate", json={"model": "flaky", "prompt": "x", "options": fail}
        ) as resp,
    ):
        assert resp.status == 200
        lines = (await resp.text()).splitlines()
    assert len(lines) == 4 and set(json.loads(lines[-1])) == {"error"}
    counters = sim.state().counters
    assert (counters.generations_failed, counters.generations_completed) == (3, 0)
    assert runner_of(sim.state(), "flaky:latest").refcount == 0


async def test_mid_stream_error_on_the_openai_routes(make_sim: MakeSim) -> None:
    sim = await make_sim(model("flaky", 1 * GiB))
    extra = {"options": {"sim_fail_after_tokens": 2}}
    messages: list[openai.types.chat.ChatCompletionMessageParam] = [
        {"role": "user", "content": "x"}
    ]
    async with openai.AsyncOpenAI(
        base_url=f"{sim.url}/v1", api_key="ollama", max_retries=0
    ) as client:
        stream = await client.chat.completions.create(
            model="flaky", messages=messages, stream=True, extra_body=extra
        )
        chunks = [chunk async for chunk in stream]
        with pytest.raises(openai.InternalServerError) as whole:
            await client.chat.completions.create(model="flaky", messages=messages, extra_body=extra)
    assert [c.choices[0].delta.content != "" for c in chunks] == [True, True, False]
    assert chunks[-1].choices[0].finish_reason is None
    assert whole.value.status_code == 500
    body = {"model": "flaky", "messages": messages, "stream": True, **extra}
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{sim.url}/v1/chat/completions", json=body) as resp,
    ):
        assert resp.headers["Content-Type"] == "text/event-stream"
        raw = await resp.text()
    assert raw.count("data: ") == 3 and "[DONE]" not in raw


async def test_load_failure_is_a_500_and_leaves_nothing_behind(
    make_sim: MakeSim, sim_host: SimulatedGpuHost
) -> None:
    sim = await make_sim(model("broken", 2 * GiB))
    async with ollama.AsyncClient(host=sim.url) as client:
        with pytest.raises(ollama.ResponseError) as caught:
            await client.generate(model="broken", prompt="x", options={"sim_load_fail": True})
    assert caught.value.status_code == 500
    assert caught.value.error == (
        "llama runner process has terminated: error loading model: simulated load failure"
    )
    state = sim.state()
    assert state.runners == () and state.counters.load_failures == 1
    assert sim_host.read().processes == []


async def test_runner_out_of_memory_during_load(
    make_sim: MakeSim, sim_host: SimulatedGpuHost, external: Callable[[int], None]
) -> None:
    external(14 * GiB)
    sim = await make_sim(model("huge", 6 * GiB, block_count=32))
    async with ollama.AsyncClient(host=sim.url) as client:
        with pytest.raises(ollama.ResponseError) as caught:
            # An explicit layer count skips the fit check, as in Ollama: the load OOMs.
            await client.generate(model="huge", prompt="x", options={"num_gpu": 99})
    assert caught.value.status_code == 500
    assert caught.value.error.startswith(
        "llama runner process has terminated: CUDA error: out of memory"
    )
    (oom,) = sim_host.ooms()
    assert oom.name == "llama-server"
    assert not proc_alive(oom.pid) and sim_host.read().held_by(oom.pid, 0) == 0
    assert sim.state().runners == ()


async def test_queue_beyond_max_queue_is_refused_with_503(make_sim: MakeSim) -> None:
    sim = await make_sim(model("slow", 1 * GiB, load_seconds=30), model("other", 1 * GiB),
                         max_queue=1)  # fmt: skip
    async with aiohttp.ClientSession() as session:
        url = f"{sim.url}/api/generate"
        loading = asyncio.create_task(session.post(url, json={"model": "slow"}))
        await sim.wait_until(lambda s: any(r.phase is RunnerPhase.LOADING for r in s.runners))
        queued = asyncio.create_task(session.post(url, json={"model": "other"}))
        await sim.wait_until(lambda s: s.pending == 1)
        async with session.post(url, json={"model": "other"}) as refused:
            assert refused.status == 503
            assert await refused.json() == {
                "error": "server busy, please try again.  maximum pending requests exceeded"
            }
        for task in (loading, queued):
            task.cancel()
        state = await sim.wait_until(lambda s: s.counters.loads_aborted == 1 and s.pending == 0)
    assert state.runners == () and state.counters.loads == 0


# -- client disconnects ----------------------------------------------------------------


async def test_client_disconnect_stops_generation_and_keeps_the_runner(
    make_sim: MakeSim,
) -> None:
    sim = await make_sim(model("chatty", 1 * GiB, tokens_per_second=40.0))
    body = {"model": "chatty", "prompt": long_prompt(20), "keep_alive": "1h"}
    async with aiohttp.ClientSession() as session:
        resp = await session.post(f"{sim.url}/api/generate", json=body)
        assert json.loads(await resp.content.readline())["done"] is False
        assert json.loads(await resp.content.readline())["done"] is False
        resp.close()
        state = await sim.wait_until(lambda s: s.counters.generations_cancelled == 1)
    assert state.counters.generations_completed == 0
    runner = runner_of(state, "chatty:latest")
    assert runner.refcount == 0 and runner.expires_at is not None  # keep_alive counting
    assert runner.phase is RunnerPhase.READY and proc_alive(runner.pid)
    assert state.counters.requests_in_flight == 0


async def test_client_disconnect_during_a_load_kills_the_half_loaded_runner(
    make_sim: MakeSim, sim_host: SimulatedGpuHost
) -> None:
    sim = await make_sim(model("slowload", 2 * GiB, load_seconds=30))
    async with aiohttp.ClientSession() as session:
        request = asyncio.create_task(
            session.post(f"{sim.url}/api/generate", json={"model": "slowload", "prompt": "x"})
        )
        state = await sim.wait_until(
            lambda s: any(r.phase is RunnerPhase.LOADING and r.pid for r in s.runners)
        )
        (loading,) = state.runners
        assert proc_alive(loading.pid)
        request.cancel()
        state = await sim.wait_until(lambda s: s.counters.loads_aborted == 1)
    assert state.runners == () and not proc_alive(loading.pid)
    assert sim_host.read().held_by(loading.pid, 0) == 0


# -- start-up --------------------------------------------------------------------------


async def test_preload_loads_models_before_start_returns(make_sim: MakeSim) -> None:
    sim = await make_sim(
        model("warm", 2 * GiB),
        model("cold", 2 * GiB),
        preload=(PreloadSpec("warm", keep_alive="-1", options={"num_ctx": 2048}),),
    )
    state = sim.state()
    runner = runner_of(state, "warm:latest")
    assert runner.keep_alive is None and runner.options.num_ctx == 2048
    assert state.runner("cold:latest") is None and state.counters.generations_started == 0
