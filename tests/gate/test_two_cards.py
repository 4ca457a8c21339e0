"""Ollama on two cards through the gate (`gpus: [0, 1]`), driven by the official client: the
gate leases each load where the simulated Ollama, placing it by Ollama's own rules, puts it
— one card, or a part on each — and an eviction on one card unloads a split model from both.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import aiohttp
import attrs
import ollama
import pytest

from gpugate.core.effects import EventKind
from gpugate.core.residents import ResidentKey, ResidentState
from gpugate.core.units import GiB, MiB
from gpugate_sim.device import SimDevice, SimulatedGpuHost
from gpugate_sim.scenario import OllamaModelSpec
from gpugate_sim.shim import STATE_ENV
from gpugate_sim.whisper import WhisperServerSpec, whisper_argv
from tests.gate.harness import FAST, running_stack
from tests.gate.test_process_start import TURBO, WHISPER, transcribe, whisper_yaml
from tests.ports import free_ports

UUIDS = ("GPU-8f3e2a71-4c5d-4b9e-a1f0-2d6c7e9b4a13", "GPU-1b7d9c24-6e0f-4a83-9d52-7c4e1f8a0b66")
MODELS = (
    OllamaModelSpec("small", 4 * GiB, block_count=28, **FAST),
    OllamaModelSpec("mid", 8 * GiB, block_count=32, **FAST),
    OllamaModelSpec("large", 22 * GiB, block_count=48, **FAST),
    OllamaModelSpec("urgent", 20 * GiB, block_count=40, **FAST),
)
MODELS_YAML = """\
small: {envelope: 4GiB}
mid: {envelope: 8GiB}
large: {envelope: 22GiB}
urgent: {envelope: 20GiB, class: production}
"""


@pytest.fixture
def two_cards(tmp_path, monkeypatch) -> SimulatedGpuHost:
    """An RTX 4090 (24 GiB) and an RTX 4080 (16 GiB); the fake library reads them."""
    host = SimulatedGpuHost.create(
        tmp_path / "gpu",
        [
            SimDevice(0, 24 * GiB, 485 * MiB, UUIDS[0], "NVIDIA GeForce RTX 4090"),
            SimDevice(1, 16 * GiB, 434 * MiB, UUIDS[1], "NVIDIA GeForce RTX 4080"),
        ],
    )
    monkeypatch.setenv(STATE_ENV, str(host.state_path))
    return host


def both(spec):  # type: ignore[no-untyped-def]
    return attrs.evolve(spec, gpus=(0, 1), models=MODELS)


def on_cards(host: SimulatedGpuHost) -> dict[int, int]:
    """What the simulated Ollama's runners hold on each card (NVML's view)."""
    held = {0: 0, 1: 0}
    for process in host.read().processes:
        if process.name.startswith("llama") or "runner" in process.name:
            held[process.gpu] += process.used
    return held


def residents(stack, model: str) -> dict[int, int]:  # type: ignore[no-untyped-def]
    return {
        r.gpu: r.bytes
        for r in stack.gate.core.residents()
        if r.key.model.split(":")[0] == model and r.state is ResidentState.RESIDENT
    }


async def test_each_load_is_leased_where_ollama_puts_it(tmp_path, two_cards, fakenvml_path):
    async with running_stack(
        tmp_path, two_cards, fakenvml_path, spec=both, models_yaml=MODELS_YAML,
        consumer_yaml="gpus: [0, 1]\n",
    ) as stack:  # fmt: skip
        client = ollama.AsyncClient(host=stack.gate_url)
        # 8 GiB fits either card within 80 %: Ollama takes the one with more free memory.
        await client.generate("mid", "hi", keep_alive="1h")
        assert residents(stack, "mid") == {0: 8 * GiB}
        assert on_cards(two_cards) == {0: 8 * GiB, 1: 0}
        # Now card 1 has more free (15.6 GiB against 15.5): the next load goes there.
        await client.generate("small", "hi", keep_alive="1h")
        assert residents(stack, "small") == {1: 4 * GiB}
        assert on_cards(two_cards) == {0: 8 * GiB, 1: 4 * GiB}
        for gpu in (0, 1):
            budget = stack.gate.core.budget(gpu)
            assert budget is not None and budget.schedulable >= 0


async def test_a_split_model_is_a_part_per_card_and_unloads_whole(
    tmp_path, two_cards, fakenvml_path
):
    async with running_stack(
        tmp_path, two_cards, fakenvml_path, spec=both, models_yaml=MODELS_YAML,
        consumer_yaml="gpus: [0, 1]\n",
    ) as stack:  # fmt: skip
        client = ollama.AsyncClient(host=stack.gate_url)
        # 22 GiB is above 80 % of either card's free memory: Ollama splits it by free memory.
        await client.generate("large", "hi", keep_alive="1h")
        held = on_cards(two_cards)
        assert held[0] > 0 and held[1] > 0 and sum(held.values()) == 22 * GiB
        assert residents(stack, "large") == held
        status = [r for r in stack.gate.core.residents() if r.key.model == "large:latest"]
        assert sorted(r.key.part for r in status) == [0, 1]
        for gpu in (0, 1):
            budget = stack.gate.core.budget(gpu)
            assert budget is not None and budget.schedulable >= 0

        # A production model that fits in neither what is free nor one card: evicting the
        # part on card 0 unloads the model from both, and Ollama splits the new one over
        # the memory that comes back. Both cards confirm their bytes back first.
        unloaded = [stack.next_event(EventKind.EVICTION_DONE, gpu=g) for g in (0, 1)]
        await client.generate("urgent", "hi", keep_alive="1h")
        await asyncio.wait_for(asyncio.gather(*unloaded), 15)
        assert residents(stack, "large") == {}
        assert "large" not in {m["name"].split(":")[0] for m in await stack.ps()}
        held = on_cards(two_cards)
        assert residents(stack, "urgent") == held
        assert sorted(held) == [0, 1] and sum(held.values()) == 20 * GiB
        assert not stack.gate.core.leases()
        assert two_cards.ooms() == []


async def test_a_process_is_started_on_the_card_the_gate_chooses(
    tmp_path, two_cards, fakenvml_path
):
    """whisper-server on `gpus: [0, 1]`: the gate starts it with CUDA_VISIBLE_DEVICES set to
    the card with room (card 0 is full of a process nobody may evict), and its memory shows
    there."""
    listen, upstream = free_ports(2)
    spec = WhisperServerSpec(
        listen=f"127.0.0.1:{upstream}", model=TURBO, models={TURBO: WHISPER}, load_seconds=0.2
    )
    extra = whisper_yaml(
        listen, upstream, whisper_argv(spec, two_cards.directory),
        residency="{policy: keep_warm, ttl: 10m}", cls="background",
    ).replace("    envelope: 2050MiB\n", "    envelope: 2050MiB\n    gpus: [0, 1]\n")  # fmt: skip
    full = 23 * GiB
    two_cards.allocate(os.getpid(), full, gpu=0, name="trainer")
    async with running_stack(
        tmp_path, two_cards, fakenvml_path, spec=both, models_yaml=MODELS_YAML,
        consumer_yaml="gpus: [0, 1]\n", extra=extra,
    ) as stack:  # fmt: skip
        status, _ = await transcribe(f"http://127.0.0.1:{listen}")
        assert status == 200
        (resident,) = [r for r in stack.gate.core.residents() if r.key.consumer == "whisper"]
        assert resident.gpu == 1
        shown = [p for p in two_cards.read().processes if p.used == WHISPER]
        assert [p.gpu for p in shown] == [1]
        environ = Path(f"/proc/{shown[0].pid}/environ").read_bytes().split(b"\0")
        assert f"CUDA_VISIBLE_DEVICES={UUIDS[1]}".encode() in environ
    two_cards.release(os.getpid(), full, gpu=0)


async def test_a_split_model_is_shown_on_each_card(tmp_path, two_cards, fakenvml_path):
    """Status, capacity and metrics: a split model on each card it spans."""
    async with running_stack(
        tmp_path, two_cards, fakenvml_path, spec=both, models_yaml=MODELS_YAML,
        consumer_yaml="gpus: [0, 1]\n",
    ) as stack:  # fmt: skip
        await ollama.AsyncClient(host=stack.gate_url).generate("large", "hi", keep_alive="1h")
        async with aiohttp.ClientSession(stack.control_url) as session:
            async with session.get("/gate/v1/status") as resp:
                status = await resp.json()
            async with session.get("/gate/v1/capacity?model=large") as resp:
                capacity = await resp.json()
            async with session.get("/gate/v1/capacity?model=mid") as resp:
                mid = (await resp.json())["models"][0]
            async with session.get("/metrics") as resp:
                metrics = await resp.text()
        parts = [r for r in status["residents"] if r["model"] == "large:latest"]
        assert sorted(r["gpu"] for r in parts) == [0, 1]
        assert all(r["spans"] == [0, 1] for r in parts)
        assert sum(r["bytes"] for r in parts) == 22 * GiB
        (row,) = capacity["models"]
        assert (row["verdict"], row["gpus"]) == ("resident", [0, 1])
        # Not loaded: where Ollama would put it now (8 GiB fits the card with more free).
        assert mid["verdict"] == "fits" and len(mid["gpus"]) == 1
        for gpu in ("0", "1"):
            line = f'gpugate_residents{{consumer="ollama",gpu="{gpu}",state="resident"}} 1.0'
            assert line in metrics


async def test_the_operator_evicts_a_split_model_whole(tmp_path, two_cards, fakenvml_path):
    async with running_stack(
        tmp_path, two_cards, fakenvml_path, spec=both, models_yaml=MODELS_YAML,
        consumer_yaml="gpus: [0, 1]\n",
    ) as stack:  # fmt: skip
        await ollama.AsyncClient(host=stack.gate_url).generate("large", "hi", keep_alive="1h")
        unloaded = [stack.next_event(EventKind.EVICTION_DONE, gpu=g) for g in (0, 1)]
        # By the model's name, as `gpugate evict ollama large` asks: both parts go.
        stack.gate.evict(ResidentKey("ollama", "large:latest"), force=False, who="test")
        await asyncio.wait_for(asyncio.gather(*unloaded), 15)
        assert residents(stack, "large") == {}
        assert on_cards(two_cards) == {0: 0, 1: 0}
