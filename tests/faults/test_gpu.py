"""GPU-side faults through the CLI: NVML loses the GPU or stalls, an external process grows,
an unload whose memory never comes back."""

from __future__ import annotations

import asyncio
import json

import pytest

from gpugate.core.units import GiB, MiB
from gpugate_sim import statefile
from tests.faults.stack import assert_nothing_lost, eventually, failures, post, stack

pytestmark = pytest.mark.e2e

NVML_ERROR_GPU_IS_LOST = 15
MEMORY_SYMBOLS = ("nvmlDeviceGetMemoryInfo", "nvmlDeviceGetMemoryInfo_v2")
BLIND = {"DRIVER_ERROR", "SCHEDULER_STATE_STALE"}


def generate(model: str) -> dict:
    return {"model": model, "prompt": "hi", "stream": False}


async def test_gpu_is_lost_then_back_resumes_without_restart(tmp_path):
    async with stack(tmp_path) as s:
        pid = s.gate.pid
        for symbol in MEMORY_SYMBOLS:
            s.host.gpu.inject(symbol, NVML_ERROR_GPU_IS_LOST)
        await eventually(s.gate.status, lambda d: d["nvml"] is not None, timeout=5)
        status, headers, body = await post(s.url + "/api/generate", generate("gemma3:12b"))
        assert status == 503, body
        assert headers.get("X-GPUGate-Failure") in BLIND
        assert int(headers["Retry-After"]) >= 1
        assert isinstance(json.loads(body)["error"], str)
        assert await s.host.sim_state() and (await s.host.sim_state())["runners"] == []
        s.host.gpu.clear_injections()
        await eventually(s.gate.status, lambda d: d["nvml"] is None, timeout=10)
        status, _, body = await post(s.url + "/api/generate", generate("gemma3:12b"))
        assert status == 200, body
        assert s.gate.pid == pid and s.gate.alive()
        await assert_nothing_lost(s)


def stall_supported() -> bool:
    """Whether the fake NVML library's state file knows the `stall` directive."""
    return "stall" in (statefile.__doc__ or "")


async def test_nvml_stall_grants_nothing_on_stale_data(tmp_path):
    # The state-file switch expected from the fake library: `stall <gpu|*> <symbol> <ms>`
    # makes that call block for that long, as a driver that stops answering does.
    assert stall_supported(), "waits for NVML stall injection in gpugate_sim/fakenvml.c"
    async with stack(tmp_path) as s:
        text = s.host.gpu.state_path.read_text()
        stall = "".join(f"stall * {symbol} 4000\n" for symbol in MEMORY_SYMBOLS)
        s.host.gpu.state_path.write_text(text + stall)
        await asyncio.sleep(1.5)  # past stale_after (1 s): the last sample is now stale
        status, headers, body = await post(s.url + "/api/generate", generate("gemma3:12b"))
        assert status == 503, body
        assert headers.get("X-GPUGate-Failure") in BLIND | {"LEASE_TIMEOUT"}
        events = await s.gate.events()
        assert not [e for e in events if e["event"] == "lease_granted"]
        s.host.gpu.state_path.write_text(text)
        await assert_nothing_lost(s)


def plex_pid(s) -> int:
    rows = [p for p in s.host.gpu.read().processes if p.name.startswith("Plex")]
    assert len(rows) == 1, rows
    return rows[0].pid


def over_the_card(gpu: dict) -> int:
    used = gpu["committed_total"] + gpu["external_total"] + gpu["reserve"] + gpu["driver_reserved"]
    return used - gpu["total"]


async def test_external_growth_evicts_idle_residents_without_oom(tmp_path):
    async with stack(tmp_path) as s:
        for model in ("gemma3:12b", "bge-m3"):
            body = {"model": model, "input": "x"} if model == "bge-m3" else generate(model)
            path = "/api/embed" if model == "bge-m3" else "/api/generate"
            status, _, answer = await post(s.url + path, body)
            assert status == 200, answer
        # 7,796 + 2,012 MiB loaded, 1.5 GiB Plex: 4 GiB more eats into the 1 GiB reserve.
        s.host.gpu.allocate(plex_pid(s), 4 * GiB)
        events = await eventually(
            s.gate.events, lambda ev: any(e["event"] == "pressure_entered" for e in ev)
        )
        await eventually(
            s.gate.events, lambda ev: any(e["event"] == "eviction_started" for e in ev)
        )
        state = await eventually(s.host.sim_state, lambda st: len(st["runners"]) < 2)
        assert state["counters"]["unloads"] >= 1
        document = await eventually(
            s.gate.status, lambda d: over_the_card(d["gpus"][0]) <= 0, timeout=10
        )
        assert over_the_card(document["gpus"][0]) <= 0
        assert s.host.gpu.ooms() == []
        assert not failures(events, "GPU_OOM")
        await assert_nothing_lost(s)


async def test_unload_whose_memory_never_comes_back(tmp_path):
    async with stack(tmp_path, host={"faults": "{keep_memory: true}"}) as s:
        # Plex at 4 GiB: llama3.2 (3,200 MiB, background) must go before gemma3 fits.
        s.host.gpu.allocate(plex_pid(s), 2560 * MiB)
        status, _, body = await post(s.url + "/api/generate", generate("llama3.2:3b"))
        assert status == 200, body
        await eventually(s.gate.status, lambda d: len(d["residents"]) == 1)
        status, headers, body = await post(s.url + "/api/generate", generate("gemma3:12b"))
        assert status == 503, body
        assert headers.get("X-GPUGate-Failure") == "GPU_MEMORY_NOT_RECLAIMED"
        assert isinstance(json.loads(body)["error"], str)
        events = await s.gate.events()
        assert failures(events, "GPU_MEMORY_NOT_RECLAIMED")
        # Suspect, not retried in a loop: wait three reclaim timeouts and count unloads.
        await asyncio.sleep(6)
        faults = await s.host.sim_get("/sim/faults")
        assert faults["unload_requests"] <= 2, faults
        document = await s.gate.status()
        suspects = [
            r
            for r in document["residents"]
            if r.get("state") == "suspect" or r.get("suspect") is True
        ]
        assert suspects, document["residents"]
        await assert_nothing_lost(s)
