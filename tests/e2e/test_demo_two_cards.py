"""`gpugate demo --two-cards`, as its own suggestions say: `gpugate status` shows both cards,
and a model that fits neither card within Ollama's 80 % is split, a part leased on each card
before it loads, shown on each card in `gpugate status`."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import ollama

from gpugate.commands.demo import demo_ports
from tests.e2e.test_demo import poll
from tests.e2e.test_installed_demo import free_port_base, start_demo
from tests.sim.processes import LineReader, kill_quietly


def status(config: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "gpugate", "status", "--config", config],
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    )
    return done.stdout


def card_block(text: str, index: int) -> str:
    """The lines of `gpugate status` for GPU `index`."""
    blocks = text.split("\nGPU ")
    return next(b for b in blocks if b.startswith(f"{index} ") or b.startswith(f"GPU {index} "))


async def test_the_two_card_demo_shows_both_cards_and_splits_a_large_model():
    base = free_port_base()
    ports = demo_ports(base)
    demo = start_demo(base, "--two-cards")
    try:
        reader = LineReader(demo.stdout)
        reader.until("Events follow", timeout=60)
        [config] = {line.split()[-1] for line in reader.seen if " status --config " in line}

        async def loaded() -> str | None:
            text = status(config)
            return text if "gemma3:12b" in text and "bge-m3" in text else None

        before = await poll(loaded)
        assert "GPU 0  NVIDIA GeForce RTX 4090" in before
        assert "GPU 1  NVIDIA GeForce RTX 4080" in before
        assert "gemma3:12b" in card_block(before, 0)

        client = ollama.AsyncClient(host=f"http://127.0.0.1:{ports['ollama']}")
        answer = await client.generate("qwen2.5:32b", "hi")
        assert answer.done
        after = status(config)
        for index in (0, 1):
            lines = [x for x in card_block(after, index).splitlines() if "qwen2.5:32b" in x]
            assert len(lines) == 1 and "split across GPUs 0, 1" in lines[0], after
        listed = await client.ps()
        (model,) = [m for m in listed.models if m.model.startswith("qwen2.5:32b")]
        assert model.size_vram == 20300 * 2**20
        demo.send_signal(signal.SIGTERM)
        assert demo.wait(timeout=60) == 0
    finally:
        if demo.poll() is None:
            os.killpg(demo.pid, signal.SIGTERM)
        kill_quietly(demo)
