"""gpugate_sim/data/two-cards.yaml: it loads, and the host it describes runs as its comments
say (where each process and each Ollama model lands)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import ollama
import pytest
import yaml

from gpugate.core.units import GiB, MiB
from gpugate_sim.host import SimulatedHost
from gpugate_sim.scenario import load_host
from tests.ports import free_ports

TWO_CARDS = Path(__file__).resolve().parents[2] / "gpugate_sim" / "data" / "two-cards.yaml"


def test_the_two_card_host_file_loads() -> None:
    spec = load_host(TWO_CARDS)
    assert [(g.name, g.total) for g in spec.gpus] == [
        ("NVIDIA GeForce RTX 4090", 24 * GiB),
        ("NVIDIA GeForce RTX 4080", 16 * GiB),
    ]
    assert len({g.uuid for g in spec.gpus}) == 2 and all(g.reserved > 0 for g in spec.gpus)
    assert spec.ollama is not None and spec.ollama.devices(2) == (0, 1)
    assert spec.comfyui is not None and spec.comfyui.gpu == 0
    assert spec.whisper is not None and spec.whisper.gpu == 1
    assert {(h.name, h.gpu) for h in spec.holders} == {("python3", 0), ("Plex Transcoder", 1)}
    sizes = {m.name: m.size for m in spec.ollama.models}
    # One model for the 4090 alone, one over either card.
    assert 16 * GiB < sizes["gemma3:27b"] < 24 * GiB * 80 // 100
    assert sizes["mixtral:8x7b"] > 24 * GiB


@pytest.fixture
def two_cards(tmp_path: Path) -> Iterator[SimulatedHost]:
    """The host file on free ports, its models quick to load."""
    data = yaml.safe_load(TWO_CARDS.read_text())
    whisper, ollama_port, comfyui = free_ports(3)
    data["whisper"]["listen"] = f"127.0.0.1:{whisper}"
    data["ollama"]["listen"] = f"127.0.0.1:{ollama_port}"
    data["comfyui"]["listen"] = f"127.0.0.1:{comfyui}"
    for entry in data["ollama"]["models"]:
        entry["load_seconds"] = "50ms"
    path = tmp_path / "two-cards.yaml"
    path.write_text(yaml.safe_dump(data))
    with SimulatedHost(load_host(path)) as host:
        yield host


def test_the_two_card_host_places_everything_as_described(two_cards: SimulatedHost) -> None:
    assert two_cards.gpu is not None and two_cards.ollama_url is not None
    state = two_cards.gpu.read()
    assert [d.name for d in state.devices] == ["NVIDIA GeForce RTX 4090", "NVIDIA GeForce RTX 4080"]
    by_name: dict[str, set[tuple[int, int]]] = {}
    for p in state.processes:
        by_name.setdefault(p.name, set()).add((p.gpu, p.used))
    assert by_name["whisper-server"] == {(1, 2050 * MiB)}
    assert {gpu for gpu, _ in by_name["Plex Transcoder"]} == {1}
    assert by_name["python3"] == {(0, 292 * MiB), (0, 210 * MiB)}  # mVoice, ComfyUI
    # The two preloads each fit the 4090 within 80 % and it has more available.
    assert by_name["llama-server"] == {(0, 7796 * MiB), (0, 2012 * MiB)}
    with ollama.Client(host=two_cards.ollama_url) as client:
        client.generate(model="qwen2.5:7b", prompt="x")
        client.generate(model="gemma3:27b", prompt="x")
        listed = {m.model: (m.size, m.size_vram) for m in client.ps().models}
    assert len(listed) == 4  # nothing was evicted
    assert listed["gemma3:27b"] == (17800 * MiB, 17800 * MiB)
    runners: dict[int, dict[int, int]] = {}
    for p in two_cards.gpu.read().processes:
        if p.name == "llama-server":
            runners.setdefault(p.pid, {})[p.gpu] = p.used
    spans = sorted(sorted(gpus.items()) for gpus in runners.values())
    # qwen2.5:7b on the 4090 alone; gemma3:27b over both cards, 17,800 MiB in all.
    assert [(0, 5700 * MiB)] in spans
    (split,) = [s for s in spans if len(s) == 2]
    assert [gpu for gpu, _ in split] == [0, 1] and sum(n for _, n in split) == 17800 * MiB
