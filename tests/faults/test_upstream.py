"""Upstream faults through the CLI: refused, died mid-stream, hung before headers or mid-stream,
a listing that is garbage. Each case asserts the class, the client's answer and that nothing
was lost (no lease, no ticket, no request the upstream still serves)."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import aiohttp
import pytest

from tests.faults.hostile import Hang, HostileUpstream
from tests.faults.stack import assert_nothing_lost, eventually, failures, post, stack
from tests.sim.processes import processes_with

pytestmark = pytest.mark.e2e


def sim_ollama_pid(state_dir) -> int:
    """The simulated Ollama server of this host (its command line names its state dir)."""
    pids = [
        pid
        for pid in processes_with(str(state_dir))
        if b"-m\0gpugate_sim.ollama\0" in Path(f"/proc/{pid}/cmdline").read_bytes()
    ]
    assert len(pids) == 1, pids
    return pids[0]


async def test_upstream_refuses_is_runtime_crash(tmp_path):
    async with stack(tmp_path) as s:
        loaded = {"model": "llama3.2:3b", "prompt": "hi", "stream": False}
        assert (await post(s.url + "/api/generate", loaded))[0] == 200
        os.kill(sim_ollama_pid(tmp_path / "state"), signal.SIGKILL)
        s.host.ollama = None  # nothing left to ask
        # A resident model and one that must be loaded: both meet a runtime that is gone.
        for model in ("llama3.2:3b", "gemma3:12b"):
            status, headers, body = await post(
                s.url + "/api/generate", {"model": model, "prompt": "hi", "stream": False}
            )
            assert status == 502, (model, body)
            assert headers.get("X-GPUGate-Failure") == "RUNTIME_CRASH"
            assert isinstance(json.loads(body)["error"], str)
        assert len(failures(await s.gate.events(), "RUNTIME_CRASH")) >= 2
        await assert_nothing_lost(s)


async def test_upstream_dies_mid_stream(tmp_path):
    async with stack(tmp_path) as s:
        body = {"model": "gemma3:12b", "prompt": "x", "options": {"sim_tokens": 2000}}
        lines = []
        async with (
            aiohttp.ClientSession() as session,
            session.post(s.url + "/api/generate", json=body) as resp,
        ):
            assert resp.status == 200
            lines.append(await resp.content.readline())
            os.kill(sim_ollama_pid(tmp_path / "state"), signal.SIGKILL)
            s.host.ollama = None
            try:
                async for line in resp.content:
                    lines.append(line)
            except aiohttp.ClientPayloadError:
                pass  # the stream ended short: what a client must see
        records = [json.loads(line) for line in lines if line.strip()]
        assert not any(r.get("done") for r in records), "the stream must not look complete"
        events = await eventually(s.gate.events, lambda ev: failures(ev, "RUNTIME_CRASH"))
        assert failures(events, "RUNTIME_CRASH")[0]["model"] == "gemma3:12b"
        await assert_nothing_lost(s)


async def test_upstream_hangs_before_headers_is_timeout(tmp_path):
    hostile = await HostileUpstream(Hang.BEFORE_HEADERS).start()
    try:
        async with stack(tmp_path, with_ollama=False, upstream_port=hostile.port) as s:
            before = (await s.gate.status())["gpus"][0]["committed_total"]
            status, headers, body = await post(
                s.url + "/api/generate", {"model": "gemma3:12b", "prompt": "hi"}, timeout=15
            )
            assert status == 504, body
            assert headers.get("X-GPUGate-Failure") == "TIMEOUT"
            assert isinstance(json.loads(body)["error"], str)
            assert failures(await s.gate.events(), "TIMEOUT")
            # The upstream request was closed, not left hanging.
            await hostile.wait_closed_requests()
            await assert_nothing_lost(s, committed=before)
    finally:
        await hostile.close()


async def test_upstream_hangs_mid_stream_is_cut(tmp_path):
    hostile = await HostileUpstream(Hang.MID_STREAM).start()
    try:
        async with stack(tmp_path, with_ollama=False, upstream_port=hostile.port) as s:
            lines = []
            timeout = aiohttp.ClientTimeout(total=15)
            async with aiohttp.ClientSession(timeout=timeout) as session:
                body = {"model": "gemma3:12b", "prompt": "hi"}
                async with session.post(s.url + "/api/generate", json=body) as resp:
                    assert resp.status == 200
                    try:
                        async for line in resp.content:
                            lines.append(line)
                    except aiohttp.ClientPayloadError:
                        pass
            assert len(lines) == 1 and json.loads(lines[0])["done"] is False
            events = await eventually(s.gate.events, lambda ev: failures(ev, "TIMEOUT"))
            assert failures(events, "TIMEOUT")
            await hostile.wait_closed_requests()
            await assert_nothing_lost(s)
    finally:
        await hostile.close()


async def health(s) -> int:
    return (await s.gate.get_text("/gate/v1/health"))[0]


async def test_garbage_listing_is_invalid_output_and_the_gate_keeps_serving(tmp_path):
    async with stack(tmp_path) as s:
        assert await health(s) == 200
        await s.host.set_faults(ps="garbage")
        events = await eventually(s.gate.events, lambda ev: failures(ev, "INVALID_OUTPUT"))
        assert failures(events, "INVALID_OUTPUT")[0]["consumer"] == "ollama"
        # Requests go on while the listing is unreadable.
        status, _, body = await post(
            s.url + "/api/generate", {"model": "llama3.2:3b", "prompt": "x", "stream": False}
        )
        assert status == 200, body
        # Health goes bad once the listing is stale, and comes back when it is readable.
        await eventually(lambda: health(s), lambda code: code == 503, timeout=15)
        await s.host.set_faults(ps="none")
        await eventually(lambda: health(s), lambda code: code == 200, timeout=15)
        assert s.gate.alive()
        await assert_nothing_lost(s)
