"""Warm again in the demo, in the README's order: the FLUX render is given what the idle
gemma3:12b and bge-m3 held (evicted for its interactive class); once ComfyUI is told to
free its memory (`POST /free`), both are loaded again by the gate, with no request for them,
and stay idle until their time-to-live would have ended."""

from __future__ import annotations

import json
import os
import signal
import time

import aiohttp

from gpugate.commands.demo import FLUX_PROMPT, demo_ports
from tests.e2e.test_demo import poll
from tests.e2e.test_installed_demo import free_port_base, start_demo
from tests.sim.processes import LineReader, kill_quietly

WARM = {"gemma3:12b", "bge-m3:latest"}
"""The models the demo finds loaded, evicted for the render, and warms again."""


async def test_the_models_evicted_for_the_flux_render_come_back_once_comfyui_frees():
    base = free_port_base()
    ports = demo_ports(base)
    gate_comfy = f"http://127.0.0.1:{ports['comfyui']}"
    gate_ollama = f"http://127.0.0.1:{ports['ollama']}"
    control = f"http://127.0.0.1:{ports['control']}"
    demo = start_demo(base)
    try:
        reader = LineReader(demo.stdout)
        reader.until("Events follow", timeout=60)
        async with aiohttp.ClientSession() as session:

            async def residents() -> dict[str, str]:
                async with session.get(control + "/gate/v1/status") as resp:
                    found = (await resp.json())["residents"]
                return {r["model"]: r["state"] for r in found}

            async def events() -> list[dict[str, object]]:
                async with session.get(control + "/gate/v1/events") as resp:
                    return [json.loads(line) for line in (await resp.text()).splitlines()]

            async def both_resident() -> bool | None:
                found = await residents()
                return True if all(found.get(m) == "resident" for m in WARM) else None

            async def settled() -> bool | None:
                # What the demo loaded behind the gate's back is listed and its
                # whisper-server is up, as by the time a reader types the README's commands.
                async with session.get(control + "/gate/v1/status") as resp:
                    status = await resp.json()
                models = {r["model"]: r["state"] for r in status["residents"]}
                (whisper,) = [c for c in status["consumers"] if c["consumer"] == "whisper"]
                up = (whisper["lifecycle"] or {}).get("state") == "up"
                return True if up and all(models.get(m) == "resident" for m in WARM) else None

            await poll(settled, timeout=120)
            # The README's order: qwen2.5:7b, then the FLUX prompt.
            body = {"model": "qwen2.5:7b", "prompt": "hi", "stream": False}
            async with session.post(gate_ollama + "/api/generate", json=body) as resp:
                assert resp.status == 200, await resp.text()

            prompt = FLUX_PROMPT.read_bytes()
            async with session.post(gate_comfy + "/prompt", data=prompt) as resp:
                assert resp.status == 200, await resp.text()
                prompt_id = (await resp.json())["prompt_id"]

            async def rendered() -> str | None:
                async with session.get(f"{gate_comfy}/history/{prompt_id}") as resp:
                    entry = (await resp.json()).get(prompt_id)
                return None if entry is None else entry["status"]["status_str"]

            assert await poll(rendered, timeout=240) == "success"
            evicted = {
                e["model"]
                for e in await events()
                if e["event"] == "eviction_started" and e.get("reason") == "eviction"
            }
            assert evicted >= WARM, evicted
            # Nothing asked for them since: they are not back while ComfyUI holds the card.
            assert not WARM & {m for m, s in (await residents()).items() if s == "resident"}

            async with session.post(gate_comfy + "/free", json={"free_memory": True}) as resp:
                assert resp.status == 200, await resp.text()
            freed = time.monotonic()

            await poll(both_resident, timeout=120)
            took = time.monotonic() - freed
            seen = await events()
            done = {e["model"] for e in seen if e["event"] == "rewarm_done"}
            assert done == WARM, [e for e in seen if str(e["event"]).startswith("rewarm")]
            # No request loaded them: every lease of theirs since the render is a rewarm's.
            granted = [e for e in seen if e["event"] == "lease_granted" and e.get("model") in WARM]
            started = [e for e in seen if e["event"] == "rewarm_started"]
            assert len(granted) <= len(started)
            print(f"both resident again {took:.1f}s after POST /free")
            async with session.get(control + "/metrics") as resp:
                metrics = await resp.text()
            lines = [x for x in metrics.splitlines() if x.startswith("gpugate_rewarms_total")]
            assert lines == ['gpugate_rewarms_total{consumer="ollama",gpu="0",outcome="done"} 2.0']
        demo.send_signal(signal.SIGTERM)
        assert demo.wait(timeout=60) == 0
    finally:
        if demo.poll() is None:
            os.killpg(demo.pid, signal.SIGTERM)
        kill_quietly(demo)
