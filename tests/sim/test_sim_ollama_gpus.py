"""The simulated Ollama on several GPUs: which GPUs a model gets, and its bytes on each.

The rules are Ollama's (server/sched.go `selectLlamaServerPlacement`, `updateFreeSpace`)
and llama.cpp's layer split by free memory; docs/runtimes/ollama.md, "Several GPUs".
Expected bytes are worked out by hand here, not with the simulator's own functions.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import ollama
import pytest
import yaml

from gpugate.core.units import GiB
from gpugate_sim.device import SimDevice, SimProcess, SimulatedGpuHost
from gpugate_sim.host import HostEnvironment
from gpugate_sim.ollama import SimOllama
from gpugate_sim.ollama.state import RunnerInfo, SimState
from gpugate_sim.scenario import OllamaModelSpec, OllamaSpec, ScenarioError, load_host

FAST = 0.02
WAIT = 10.0
MakeSim = Callable[..., Awaitable[SimOllama]]

NVML_PROCESSES = """
import json, pynvml
pynvml.nvmlInit()
rows = {}
for index in range(pynvml.nvmlDeviceGetCount()):
    device = pynvml.nvmlDeviceGetHandleByIndex(index)
    rows[index] = {p.pid: p.usedGpuMemory
                   for p in pynvml.nvmlDeviceGetComputeRunningProcesses(device)}
print(json.dumps(rows))
"""


def model(name: str, size: int, **fields: object) -> OllamaModelSpec:
    fields.setdefault("load_seconds", FAST)
    return OllamaModelSpec(name, size=size, **fields)  # type: ignore[arg-type]


def cards(tmp_path: Path, *totals: int) -> SimulatedGpuHost:
    """Cards of these sizes, no driver reservation: the arithmetic below stays exact."""
    return SimulatedGpuHost.create(
        tmp_path / "gpu",
        [
            SimDevice(i, total, 0, f"GPU-{i}a5e7c13-0000-4000-8000-00000000000{i}", f"card {i}")
            for i, total in enumerate(totals)
        ],
    )


@pytest.fixture
async def make_sim() -> AsyncIterator[Callable[..., Awaitable[SimOllama]]]:
    """Start SimOllama servers on a given host; on teardown no runner may survive."""
    started: list[tuple[SimOllama, SimulatedGpuHost]] = []

    async def make(host: SimulatedGpuHost, *models: OllamaModelSpec, **fields: object) -> SimOllama:
        fields.setdefault("tokens_per_second", 5000.0)
        sim = SimOllama(OllamaSpec(models=models, **fields), host)  # type: ignore[arg-type]
        await sim.start("127.0.0.1", 0)
        started.append((sim, host))
        return sim

    yield make
    for sim, host in started:
        await sim.close()
        assert [p for p in host.read().processes if p.name == "llama-server"] == []


async def load(sim: SimOllama, name: str, **body: object) -> RunnerInfo:
    async with ollama.AsyncClient(host=sim.url) as client:
        await client.generate(model=name, prompt="x", **body)  # type: ignore[arg-type]
    return runner_of(sim.state(), name)


def runner_of(state: SimState, name: str) -> RunnerInfo:
    full = name if ":" in name else f"{name}:latest"
    runner = state.runner(full)
    assert runner is not None, f"{full} is not loaded: {state.runners}"
    return runner


def shown(pid: int | None) -> str:
    """The runner's command line as /proc shows it."""
    return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()


def held(host: SimulatedGpuHost, runner: RunnerInfo) -> tuple[int, int]:
    assert runner.pid is not None
    state = host.read()
    return state.held_by(runner.pid, 0), state.held_by(runner.pid, 1)


# -- one GPU out of several ------------------------------------------------------------


async def test_a_model_that_fits_one_card_goes_to_the_card_with_most_available(
    tmp_path: Path, make_sim: MakeSim
) -> None:
    host = cards(tmp_path, 16 * GiB, 24 * GiB)
    sim = await make_sim(host, model("qwen2.5:7b", 5 * GiB))
    runner = await load(sim, "qwen2.5:7b")
    assert runner.vram_by_gpu == ((1, 5 * GiB),)
    assert held(host, runner) == (0, 5 * GiB)
    # Ollama starts it on that one GPU, in single-GPU mode.
    assert "--split-mode none --main-gpu 0" in shown(runner.pid)


async def test_equal_cards_keep_the_earlier_one_and_then_the_emptier_one_wins(
    tmp_path: Path, make_sim: MakeSim
) -> None:
    host = cards(tmp_path, 16 * GiB, 16 * GiB)
    sim = await make_sim(host, model("a", 2 * GiB), model("b", 2 * GiB), model("c", 3 * GiB))
    assert (await load(sim, "a")).vram_by_gpu == ((0, 2 * GiB),)  # a tie: the first
    assert (await load(sim, "b")).vram_by_gpu == ((1, 2 * GiB),)  # 16 GiB beat 14
    assert (await load(sim, "c")).vram_by_gpu == ((0, 3 * GiB),)  # a tie again: 14 and 14


async def test_an_explicit_main_gpu_indexes_the_gpus_ollama_sees(
    tmp_path: Path, make_sim: MakeSim
) -> None:
    host = cards(tmp_path, 16 * GiB, 24 * GiB)
    # Ollama sees host GPU 1 first (CUDA_VISIBLE_DEVICES=1,0): its main_gpu 1 is host GPU 0,
    # although host GPU 1 has more room.
    sim = await make_sim(host, model("pinned", 4 * GiB), gpus=(1, 0))
    runner = await load(sim, "pinned", options={"main_gpu": 1})
    assert runner.vram_by_gpu == ((0, 4 * GiB),)
    assert held(host, runner) == (4 * GiB, 0)
    assert "--split-mode none --main-gpu 0" in shown(runner.pid)


async def test_a_main_gpu_beyond_the_list_fails_the_load_as_llama_cpp_refuses_it(
    tmp_path: Path, make_sim: MakeSim
) -> None:
    host = cards(tmp_path, 16 * GiB, 24 * GiB)
    sim = await make_sim(host, model("nowhere", 4 * GiB))
    async with ollama.AsyncClient(host=sim.url) as client:
        with pytest.raises(ollama.ResponseError) as caught:
            await client.generate(model="nowhere", prompt="x", options={"main_gpu": 2})
    assert caught.value.status_code == 500
    assert caught.value.error == (
        "llama runner process has terminated: llama_model_load_from_file_impl: invalid value "
        "for main_gpu: 2 (available devices: 2)"
    )
    assert sim.state().runners == () and host.read().processes == []


async def test_num_gpu_zero_keeps_the_model_off_every_card(
    tmp_path: Path, make_sim: MakeSim
) -> None:
    host = cards(tmp_path, 16 * GiB, 24 * GiB)
    sim = await make_sim(host, model("phi3", 2 * GiB))
    runner = await load(sim, "phi3", options={"num_gpu": 0})
    assert (runner.size, runner.size_vram, runner.vram_by_gpu) == (2 * GiB, 0, ())
    assert held(host, runner) == (0, 0)


# -- split models ----------------------------------------------------------------------


async def test_sched_spread_splits_even_a_model_that_fits_one_card(
    tmp_path: Path, make_sim: MakeSim
) -> None:
    host = cards(tmp_path, 16 * GiB, 24 * GiB)
    sim = await make_sim(host, model("small", 4 * GiB, block_count=31), sched_spread=True)
    runner = await load(sim, "small")
    # 32 layers (31 blocks and the output layer) split at 16/40 of them: layer il goes to
    # GPU 0 while 16 * 32 > il * 40, i.e. layers 0..12.
    on_first = 4 * GiB * 13 // 32
    assert runner.vram_by_gpu == ((0, on_first), (1, 4 * GiB - on_first))
    assert held(host, runner) == (on_first, 4 * GiB - on_first)
    assert "--split-mode" not in shown(runner.pid)


async def test_a_model_larger_than_any_card_splits_by_free_memory_and_shows_on_both(
    tmp_path: Path, make_sim: MakeSim, fakenvml_path: Path
) -> None:
    host = cards(tmp_path, 16 * GiB, 24 * GiB)
    host.add_process(SimProcess(1, os.getpid(), 4 * GiB, "C", "Plex Transcoder"))
    sim = await make_sim(host, model("big", 27 * GiB, block_count=35))
    runner = await load(sim, "big")
    # Free 16 and 20 GiB: of 36 layers GPU 0 takes those with 16 * 36 > il * 36, 0..15,
    # so the bytes go 16:20, as the free memory does.
    first, second = 12 * GiB, 15 * GiB
    assert runner.vram_by_gpu == ((0, first), (1, second))
    async with ollama.AsyncClient(host=sim.url) as client:
        (entry,) = (await client.ps()).models
    assert entry.size == entry.size_vram == 27 * GiB
    # Through NVML, as the gate reads it: one PID on both cards, each with its part.
    env = dict(os.environ)
    env.update(HostEnvironment(host.state_path, fakenvml_path).variables())
    probe = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-c", NVML_PROCESSES],
        env=env,
        capture_output=True,
        text=True,
        timeout=WAIT,
        check=True,
    )
    rows = json.loads(probe.stdout)
    assert rows["0"] == {str(runner.pid): first}
    assert rows["1"] == {str(os.getpid()): 4 * GiB, str(runner.pid): second}
    host.release(os.getpid())


async def test_a_split_that_does_not_fit_keeps_the_margin_free_on_each_card(
    tmp_path: Path, make_sim: MakeSim
) -> None:
    host = cards(tmp_path, 16 * GiB, 24 * GiB)
    margin = 1 * GiB
    sim = await make_sim(host, model("huge", 48 * GiB, block_count=47), fit_margin=margin)
    runner = await load(sim, "huge")
    # Nothing else loaded: it loads anyway, each card filled to its margin, the rest in RAM.
    assert runner.vram_by_gpu == ((0, 15 * GiB), (1, 23 * GiB))
    assert runner.size_vram == 38 * GiB < runner.size
    assert held(host, runner) == (15 * GiB, 23 * GiB)
    assert host.ooms() == []


# -- the memory a load is weighed against ----------------------------------------------


async def test_a_load_evicts_only_when_its_gpus_lack_the_room(
    tmp_path: Path, make_sim: MakeSim
) -> None:
    host = cards(tmp_path, 16 * GiB, 24 * GiB)
    sim = await make_sim(
        host,
        model("alpha", 18 * GiB),
        model("gamma", 9 * GiB),
        model("beta", 26 * GiB, block_count=25),
    )
    alpha = await load(sim, "alpha", keep_alive="10m")
    assert alpha.vram_by_gpu == ((1, 18 * GiB),)  # 18 <= 80 % of 24, not of 16
    # 9 GiB fits the 16 free on GPU 0, not the 6 left on GPU 1: loaded beside alpha.
    gamma = await load(sim, "gamma", keep_alive="1h")
    assert gamma.vram_by_gpu == ((0, 9 * GiB),)
    assert runner_of(sim.state(), "alpha").pid == alpha.pid
    # 26 GiB fits no card: split, weighed against 7 + 6 GiB, so alpha (the shorter
    # keep_alive) goes first; then 7 + 24 GiB hold it.
    beta = await load(sim, "beta")
    state = sim.state()
    assert state.runner("alpha:latest") is None
    assert runner_of(state, "gamma").pid == gamma.pid
    # Free 7 and 24 GiB, 26 layers: GPU 0 takes those with 7 * 26 > il * 31, 0..5.
    assert beta.vram_by_gpu == ((0, 6 * GiB), (1, 20 * GiB))
    assert (state.counters.loads, state.counters.unloads) == (3, 1)


async def test_ollama_counts_its_own_runners_even_when_the_driver_reports_them_gone(
    tmp_path: Path, make_sim: MakeSim
) -> None:
    host = cards(tmp_path, 16 * GiB, 16 * GiB)
    sim = await make_sim(host, model("alpha", 10 * GiB), model("beta", 6 * GiB))
    alpha = await load(sim, "alpha")
    assert alpha.vram_by_gpu == ((0, 10 * GiB),) and alpha.pid is not None
    # The runner dies behind Ollama's back: its memory is back at once, but Ollama still
    # has it loaded and counts its 10 GiB against GPU 0 (min(16, 16 - 10) = 6 available).
    os.kill(alpha.pid, signal.SIGKILL)
    await until(lambda: host.free(0) == 16 * GiB, "the driver to free the dead runner's memory")
    beta = await load(sim, "beta")
    assert beta.vram_by_gpu == ((1, 6 * GiB),)  # by the driver alone: a tie, so GPU 0


async def until(condition: Callable[[], bool], what: str) -> None:
    """Poll a state that only the shared device file shows, with a deadline."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + WAIT
    while not condition():
        assert loop.time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.01)


# -- which GPUs it sees ----------------------------------------------------------------


async def test_gpu_n_confines_ollama_to_that_card(tmp_path: Path, make_sim: MakeSim) -> None:
    host = cards(tmp_path, 16 * GiB, 24 * GiB)
    sim = await make_sim(host, model("m", 5 * GiB), gpu=0)
    runner = await load(sim, "m")
    # Its only GPU: no choice made, so no single-GPU flags either (as on a one-card host).
    assert runner.vram_by_gpu == ((0, 5 * GiB),)
    assert "--split-mode" not in shown(runner.pid)


def test_the_gpus_ollama_sees_and_how_many_runners_it_keeps() -> None:
    assert OllamaSpec().devices(2) == (0, 1)
    assert OllamaSpec(gpu=1).devices(2) == (1,)
    assert OllamaSpec(gpus=(1, 0)).devices(2) == (1, 0)
    # OLLAMA_MAX_LOADED_MODELS unset: 3 per GPU it sees.
    assert (OllamaSpec().loaded_limit(2), OllamaSpec().loaded_limit(1)) == (6, 3)
    assert OllamaSpec(max_loaded_models=2).loaded_limit(2) == 2


@pytest.mark.parametrize(
    ("ollama_section", "message"),
    [
        ({"gpu": 0, "gpus": [0, 1]}, "ollama: give gpu or gpus, not both"),
        ({"gpus": [0, 2]}, "ollama.gpus[1]: no GPU 2 (the host has 2)"),
        ({"gpus": [1, 1]}, "ollama.gpus[1]: GPU 1 is listed twice"),
        ({"gpus": []}, "ollama.gpus: expected a non-empty list of GPU indexes, got []"),
        ({"gpu": 3}, "ollama.gpu: no GPU 3 (the host has 2)"),
        ({"sched_spread": "yes"}, "ollama.sched_spread: expected true or false, got 'yes'"),
    ],
)
def test_a_host_file_names_only_gpus_the_host_has(
    tmp_path: Path, ollama_section: dict[str, object], message: str
) -> None:
    path = tmp_path / "host.yaml"
    path.write_text(
        yaml.safe_dump({"gpus": [{"total": "24GiB"}, {"total": "16GiB"}], "ollama": ollama_section})
    )
    with pytest.raises(ScenarioError) as caught:
        load_host(path)
    assert str(caught.value) == f"{path}: {message}"
