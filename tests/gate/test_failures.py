"""Failures reach the client in its own shape, with the class, and leave nothing behind."""

from __future__ import annotations

import asyncio
import json
import logging
import subprocess
from collections.abc import Mapping

import aiohttp
import ollama
import pytest

from gpugate.core.effects import EventKind
from gpugate.core.residents import ANY_OPTIONS, ResidentKey
from gpugate.core.units import GiB
from tests.gate.harness import running_stack


async def post(url: str, path: str, body: dict) -> tuple[int, Mapping[str, str], dict]:
    async with aiohttp.ClientSession() as session, session.post(url + path, json=body) as resp:
        # case-insensitive: Go's net/http, as the gate speaks it before Ollama, writes
        # canonical names (X-Gpugate-Failure)
        return resp.status, resp.headers.copy(), await resp.json()


async def test_upstream_down_is_runtime_crash_in_each_shape(stack):
    await ollama.AsyncClient(host=stack.gate_url).generate(
        model="llama3.2:3b", prompt="x", options={"num_predict": 1}
    )
    failures = []
    stack.gate.events.subscribe(
        lambda e: failures.append(e.failure) if e.kind is EventKind.FAILURE else None
    )
    await stack.sim.close()
    # A resident model (no sizing needed) and an unsized one, on both API families.
    status, headers, body = await post(
        stack.gate_url, "/api/generate", {"model": "llama3.2:3b", "prompt": "x"}
    )
    assert status == 502
    assert headers["X-GPUGate-Failure"] == "RUNTIME_CRASH"
    assert body["error"].startswith("RUNTIME_CRASH: ollama at http://127.0.0.1:")
    status, headers, body = await post(
        stack.gate_url,
        "/v1/chat/completions",
        {"model": "qwen2.5:7b", "messages": [{"role": "user", "content": "x"}]},
    )
    assert status == 502
    assert body["error"]["code"] == "RUNTIME_CRASH"
    assert body["error"]["type"] == "api_error"
    assert body["error"]["param"] is None
    assert body["error"]["message"].startswith("RUNTIME_CRASH: ")
    # The requests' own failures (a failed listing of the stopped runtime has no model).
    requests = [f for f in failures if f.model is not None]
    assert [f.failure_class.value for f in requests] == ["RUNTIME_CRASH", "RUNTIME_CRASH"]
    assert stack.gate.core.leases() == []
    assert stack.gate.core.waiting() == []


async def test_a_load_that_fails_upstream_is_reported_and_leaves_no_lease(stack):
    failed = stack.next_event(EventKind.FAILURE, model="qwen2.5:7b")
    status, headers, body = await post(
        stack.gate_url,
        "/api/generate",
        {"model": "qwen2.5:7b", "prompt": "x", "options": {"sim_load_fail": True}},
    )
    assert status == 500
    assert headers["X-GPUGate-Failure"] == "MODEL_LOAD_FAILED"
    assert set(body) == {"error"}  # Ollama's own error body, untouched
    event = await failed
    assert event.failure.failure_class.value == "MODEL_LOAD_FAILED"
    assert stack.gate.core.leases() == []
    assert stack.gate.core.residents() == []
    assert stack.gate.core.budget(0).consumer("ollama").pending == 0


async def test_a_model_loaded_behind_the_gate_is_found_and_reclaimed(stack):
    found = stack.next_event(EventKind.OUT_OF_BAND_RESIDENT, model="bge-m3:latest")
    # Straight at Ollama from loopback, with a keep_alive of a day.
    await ollama.AsyncClient(host=stack.sim_url).embed(model="bge-m3", input="x", keep_alive="24h")
    await asyncio.wait_for(found, 10)
    key = ResidentKey("ollama", "bge-m3:latest", ANY_OPTIONS)
    resident = stack.gate.core.resident(key)
    assert resident is not None and resident.out_of_band
    assert resident.priority.label == "background"  # its class from consumers.yaml
    # gemma (7.6) + qwen (5.6) + bge (2.0) > 14.6 GiB: the stray bge-m3 is evicted.
    client = ollama.AsyncClient(host=stack.gate_url)
    await client.generate(model="gemma3:12b", prompt="x", options={"num_predict": 1})
    evicted = stack.next_event(EventKind.EVICTION_DONE, model="bge-m3:latest")
    await client.generate(model="qwen2.5:7b", prompt="x", options={"num_predict": 1})
    assert (await evicted).detail.startswith("reclaimed; ")
    assert sorted(m["name"] for m in await stack.ps()) == ["gemma3:12b", "qwen2.5:7b"]
    assert stack.host.ooms() == []


async def test_partial_offload_after_a_load_is_an_event(stack):
    hog = subprocess.Popen(["sleep", "60"])
    try:
        stack.host.allocate(hog.pid, 10 * GiB, name="Plex Transcoder")
        offload = stack.next_event(EventKind.PARTIAL_OFFLOAD, model="gemma3:12b")
        # Loaded straight at Ollama, which spills what does not fit to the CPU.
        await ollama.AsyncClient(host=stack.sim_url).generate(
            model="gemma3:12b", prompt="x", options={"num_predict": 1}
        )
        event = await asyncio.wait_for(offload, 10)
        assert "the rest on the CPU" in event.detail
        (entry,) = await stack.ps()
        assert entry["size_vram"] < entry["size"]
    finally:
        hog.kill()
        hog.wait()


@pytest.mark.parametrize("path", ["/api/generate", "/v1/chat/completions"])
async def test_malformed_json_gets_ollamas_own_answer(stack, path):
    answers = []
    async with aiohttp.ClientSession() as session:
        for url in (stack.sim_url, stack.gate_url):
            async with session.post(
                url + path,
                data=b'{"model": "llama3.2:3b", ',
                headers={"Content-Type": "application/json"},
            ) as resp:
                answers.append((resp.status, await resp.text()))
    assert answers[1] == answers[0]
    assert answers[0][0] == 400
    assert stack.gate.core.leases() == []


async def test_a_body_over_the_limit_is_refused_in_the_runtimes_shape(
    tmp_path, sim_host, fakenvml_path
):
    async with running_stack(
        tmp_path, sim_host, fakenvml_path, consumer_yaml="max_body: 1KiB\n"
    ) as stack:
        big = {"model": "llama3.2:3b", "prompt": "x" * 4096}
        status, headers, body = await post(stack.gate_url, "/api/generate", big)
        assert status == 413
        assert headers["Content-Type"].startswith("application/json")
        assert body == {"error": "http: request body too large"}
        assert stack.gate.core.leases() == []


async def test_a_client_that_stops_mid_body_is_dropped_without_a_lease(stack):
    host, port = stack.gate_url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(
        b"POST /api/generate HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
        b"Content-Length: 100\r\n\r\n" + b'{"model": "llama3.2:3b"'
    )
    # (A Host Ollama refuses would be answered its 403 before the body is read, as Ollama
    # answers it: the host check needs no body.)
    writer.write_eof()
    # The client is gone before its request is whole: nothing to answer, nothing admitted.
    assert await reader.read() == b""
    writer.close()
    assert stack.gate.core.leases() == [] and stack.gate.core.waiting() == []
    assert [e for e in stack.gate.recent_events() if e.model == "llama3.2:3b"] == []


async def test_each_failure_is_one_json_log_line_with_its_fields(stack, caplog):
    caplog.set_level(logging.INFO, logger="gpugate.events")
    hog = subprocess.Popen(["sleep", "60"])
    try:
        # Plex takes 10 GiB: 4.6 GiB stay schedulable.
        stack.host.allocate(hog.pid, 10 * GiB, name="Plex Transcoder")
        stack.gate.observe(await stack.gate.sampler.sample())
        body = {"model": "bge-m3", "input": "x"}
        status, _, _ = await post(stack.gate_url, "/api/embed", body)
        assert status == 200
        # The load's lease is one line; its release, and the requests a resident serves,
        # are routine (DEBUG).
        logged = [json.loads(r.getMessage()) for r in caplog.records if r.name == "gpugate.events"]
        assert [(x["event"], x["model"]) for x in logged] == [("lease_granted", "bge-m3:latest")]
        status, _, _ = await post(stack.gate_url, "/api/embed", body)
        again = [r for r in caplog.records if r.name == "gpugate.events"]
        assert status == 200 and len(again) == len(logged)
        # qwen needs 5.6 GiB; even without the idle bge-m3 only 4.6 GiB would be free.
        body = {"model": "qwen2.5:7b", "prompt": "x", "stream": False}
        status, headers, answer = await post(stack.gate_url, "/api/generate", body)
    finally:
        hog.kill()
        hog.wait()
    assert status == 503
    assert headers["X-GPUGate-Failure"] == "INSUFFICIENT_SCHEDULABLE_VRAM"
    lines = [json.loads(r.getMessage()) for r in caplog.records if r.name == "gpugate.events"]
    (failure,) = [line for line in lines if line["event"] == "failure"]
    assert failure["class"] == "INSUFFICIENT_SCHEDULABLE_VRAM"
    assert (failure["consumer"], failure["model"], failure["gpu"]) == ("ollama", "qwen2.5:7b", 0)
    assert failure["bytes_needed"] == 5700 * 2**20
    assert failure["bytes_schedulable"] > 0
    assert failure["message"] == answer["error"]
    assert "external 10.0 GiB: plex" not in failure["message"]  # not a configured service
    assert "external 10.0 GiB: other 10.0" in failure["message"]
