"""`make run` as the README tells it: `gpugate demo`, its own suggestions, on its own ports
(moved together with `--port-base` to a free range, as the README shows beside a real Ollama).

The demo's FLUX prompt renders through the gate; health stays 200 past the point where
every consumer's listing would have gone stale; its whisper-server killed with SIGKILL is
started again (always_warm), once; and stopping the demo leaves nothing running.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import aiohttp

from gpugate.commands.demo import FLUX_PROMPT, demo_ports
from gpugate.commands.local_token import local_token_path
from gpugate.runtimes.process_find import listening_pids
from tests.e2e.test_installed_demo import free_port_base, start_demo
from tests.gate.test_process_start import wav_bytes
from tests.sim.processes import LineReader, kill_quietly

ROOT = Path(__file__).resolve().parents[2]
STALE_AFTER = 20.0
"""Longer than a consumer's listing stays fresh without a refresh (16 s reported 503)."""


async def poll(check, timeout: float = 60.0, interval: float = 0.1):  # type: ignore[no-untyped-def]
    """Call `check` until it returns something other than None (what a client would do)."""
    async with asyncio.timeout(timeout):
        while (found := await check()) is None:
            await asyncio.sleep(interval)
        return found


async def test_the_demo_renders_flux_stays_healthy_and_restarts_whisper_once():
    started = time.monotonic()
    base = free_port_base()
    ports = demo_ports(base)
    gate_comfy = f"http://127.0.0.1:{ports['comfyui']}"
    gate_whisper = f"http://127.0.0.1:{ports['whisper']}"
    control = f"http://127.0.0.1:{ports['control']}"
    whisper_port = ports["whisper_upstream"]
    demo = start_demo(base)
    try:
        reader = LineReader(demo.stdout)
        reader.until("Events follow", timeout=60)
        async with aiohttp.ClientSession() as session:
            # The gate finds the models loaded behind its back from Ollama's first listing.

            async def listed() -> bool | None:
                async with session.get(control + "/gate/v1/status") as resp:
                    models = {r["model"] for r in (await resp.json())["residents"]}
                return True if {"gemma3:12b", "bge-m3:latest"} <= models else None

            await poll(listed)

            # The demo's whisper-server (always_warm) is up: its start has settled in the
            # books, as it has by the time a reader types the README's commands.
            async def whisper_up() -> bool | None:
                async with session.get(control + "/gate/v1/status") as resp:
                    consumers = (await resp.json())["consumers"]
                (whisper,) = [c for c in consumers if c["consumer"] == "whisper"]
                return True if (whisper["lifecycle"] or {}).get("state") == "up" else None

            await poll(whisper_up)
        # An operator command of the README, as printed: the demo's token reaches it.
        [config] = {line.split()[-1] for line in reader.seen if " evict ollama bge-m3 " in line}
        evict = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "gpugate", "evict", "ollama", "bge-m3", "--config", config,
            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )  # fmt: skip
        out, err = await evict.communicate()
        assert evict.returncode == 0, (out, err)
        async with aiohttp.ClientSession() as session:
            prompt = FLUX_PROMPT.read_bytes()
            async with session.post(gate_comfy + "/prompt", data=prompt) as resp:
                assert resp.status == 200, await resp.text()
                prompt_id = (await resp.json())["prompt_id"]

            async def rendered() -> str | None:
                async with session.get(f"{gate_comfy}/history/{prompt_id}") as resp:
                    entry = (await resp.json()).get(prompt_id)
                return None if entry is None else entry["status"]["status_str"]

            assert await poll(rendered) == "success"

            async def whisper_pid() -> int | None:
                pids = listening_pids(whisper_port)
                return pids[0] if len(pids) == 1 else None

            first = await poll(whisper_pid)
            os.kill(first, signal.SIGKILL)

            async def restarted() -> int | None:
                pid = await whisper_pid()
                return pid if pid not in (None, first) else None

            second = await poll(restarted)
            form = aiohttp.FormData()
            form.add_field("file", wav_bytes(0.5), filename="a.wav", content_type="audio/wav")
            async with session.post(gate_whisper + "/inference", data=form) as resp:
                assert resp.status == 200, await resp.text()
            assert listening_pids(whisper_port) == [second], "started again once, not twice"

            await asyncio.sleep(max(0.0, STALE_AFTER - (time.monotonic() - started)))
            async with session.get(control + "/gate/v1/health") as resp:
                body = await resp.json()
                assert resp.status == 200, body
            assert body["ok"] is True, json.dumps(body)
        demo.send_signal(signal.SIGTERM)
        assert demo.wait(timeout=60) == 0
        assert listening_pids(whisper_port) == [], "the gate's whisper-server went with it"
        assert not local_token_path(ports["control"]).exists(), "its token went with it"
    finally:
        if demo.poll() is None:
            os.killpg(demo.pid, signal.SIGTERM)
        kill_quietly(demo)


async def test_the_demos_whisper_is_up_at_ready_and_a_smaller_model_loaded_serves_at_once():
    # The demo's whisper has no envelope per model: base.en (200 MiB in the simulation) is
    # leased the consumer's 2,050 MiB. A lease that waited for NVML to show them would hold
    # the next transcription until `start_admission_timeout` (120 s by default).
    base = free_port_base()
    ports = demo_ports(base)
    gate_whisper = f"http://127.0.0.1:{ports['whisper']}"
    control = f"http://127.0.0.1:{ports['control']}"
    demo = start_demo(base)
    try:
        reader = LineReader(demo.stdout)
        assert reader.until("gpugate: ready", timeout=60).strip() == "gpugate: ready"
        async with aiohttp.ClientSession() as session:
            async with session.get(control + "/gate/v1/status") as resp:
                consumers = (await resp.json())["consumers"]
            (whisper,) = [c for c in consumers if c["consumer"] == "whisper"]
            assert whisper["lifecycle"]["state"] == "up", "ready means its whisper is up"

            form = aiohttp.FormData()
            form.add_field("model", "models/ggml-base.en.bin", content_type="text/plain")
            async with session.post(gate_whisper + "/load", data=form) as resp:
                assert resp.status == 200, await resp.text()
                lease = int(resp.headers["X-GPUGate-Lease"])
            form = aiohttp.FormData()
            form.add_field("file", wav_bytes(0.5), filename="a.wav", content_type="audio/wav")
            # Bounded far below the 120 s a lease waiting for NVML would take.
            async with asyncio.timeout(60):
                async with session.post(gate_whisper + "/inference", data=form) as resp:
                    assert resp.status == 200, await resp.text()
                    assert "text" in await resp.json()
            async with session.get(control + "/gate/v1/events") as resp:
                events = [json.loads(line) for line in (await resp.text()).splitlines()]
        ended = [e for e in events if e.get("lease") == lease and e["event"] == "lease_released"]
        assert [e["reason"] for e in ended] == ["done"], "ended by whisper-server's answer"
        failures = [e for e in events if e["event"] == "failure" and e.get("consumer") == "whisper"]
        assert failures == [], failures
        demo.send_signal(signal.SIGTERM)
        assert demo.wait(timeout=60) == 0
    finally:
        if demo.poll() is None:
            os.killpg(demo.pid, signal.SIGTERM)
        kill_quietly(demo)
