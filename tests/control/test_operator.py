"""Operator actions through the real control app: evict, drain, pause, each an event."""

from __future__ import annotations

import asyncio
import json

import aiohttp
import ollama
import pytest

from gpugate.commands.exits import Exit
from gpugate.core.classes import ResidencyPolicy
from gpugate.core.effects import EventKind
from tests.control.conftest import admin

ROUTES = (
    "/gate/v1/residents/ollama/bge-m3:latest/evict",
    "/gate/v1/consumers/ollama/drain",
    "/gate/v1/consumers/ollama/undrain",
    "/gate/v1/gpus/0/pause",
    "/gate/v1/gpus/0/resume",
)


async def post(stack, path: str) -> tuple[int, dict, dict]:
    async with (
        aiohttp.ClientSession() as session,
        session.post(stack.control_url + path, headers=admin()) as resp,
    ):
        return resp.status, dict(resp.headers), await resp.json()


def events_of(stack, kind: EventKind) -> list:
    return [e for e in stack.gate.recent_events() if e.kind is kind]


async def embed(stack) -> None:
    await ollama.AsyncClient(host=stack.gate_url).embed(model="bge-m3", input="x")


@pytest.mark.parametrize("path", ROUTES)
async def test_each_operator_route_needs_a_token(stack, path):
    async with aiohttp.ClientSession() as session, session.post(stack.control_url + path) as resp:
        assert resp.status == 401
        assert resp.headers["WWW-Authenticate"].startswith("Bearer")
    assert stack.gate.core.operator.paused() == [] and stack.gate.core.operator.draining(
        "ollama"
    ) == (False, False)


async def test_an_evicted_resident_is_gone_after_eviction_done(stack):
    await embed(stack)
    key = next(r.key for r in stack.gate.core.residents() if r.key.model.startswith("bge-m3"))
    done = stack.next_event(EventKind.EVICTION_DONE, key=key)
    status, _, body = await post(stack, "/gate/v1/residents/ollama/bge-m3:latest/evict")
    assert status == 202, body
    assert body["key"] == {"consumer": "ollama", "model": key.model, "options": key.options}
    event = await asyncio.wait_for(done, 10)
    assert event.reason == "operator" and event.detail.startswith("reclaimed")
    assert stack.gate.core.resident(key) is None
    assert "bge-m3:latest" not in {m["name"] for m in await stack.ps()}
    started = events_of(stack, EventKind.EVICTION_STARTED)[-1]
    assert started.reason == "operator" and "asked by token" in started.detail
    assert stack.gate.core.leases() == [] and stack.gate.core.waiting() == []
    status, _, body = await post(stack, "/gate/v1/residents/ollama/bge-m3:latest/evict")
    assert status == 200 and body["loaded"] is False, body
    assert body["key"]["model"] == "bge-m3:latest"
    assert len(events_of(stack, EventKind.EVICTION_STARTED)) == 1


async def test_eviction_refusals(stack):
    status, headers, body = await post(stack, "/gate/v1/residents/ollama/no-such-model/evict")
    assert status == 404 and body["error"]["class"] == "NOT_FOUND"
    assert "no-such-model" in body["error"]["message"]
    await embed(stack)
    key = next(r.key for r in stack.gate.core.residents() if r.key.model.startswith("bge-m3"))
    resident = stack.gate.core.resident(key)
    resident.policy = ResidencyPolicy.ALWAYS_WARM
    status, headers, body = await post(stack, "/gate/v1/residents/ollama/bge-m3:latest/evict")
    assert status == 409 and headers["X-GPUGate-Failure"] == "EVICTION_NOT_ALLOWED"
    resident.in_flight = 1
    status, _, body = await post(stack, "/gate/v1/residents/ollama/bge-m3:latest/evict?force=1")
    assert status == 409 and body["error"]["class"] == "RESIDENCY_CONFLICT"
    assert "serving 1" in body["error"]["message"]
    resident.in_flight = 0
    done = stack.next_event(EventKind.EVICTION_DONE, key=key)
    status, _, body = await post(stack, "/gate/v1/residents/ollama/bge-m3:latest/evict?force=1")
    assert status == 202 and body["force"] is True
    await asyncio.wait_for(done, 10)
    assert stack.gate.core.resident(key) is None
    assert not events_of(stack, EventKind.FAILURE)


async def test_a_model_loaded_since_the_last_listing_is_listed_before_not_found(stack):
    # Loaded straight at the runtime a moment ago: the books learn of it from a listing,
    # the next of which is up to 2 s away.
    await ollama.AsyncClient(host=stack.sim_url).embed(model="bge-m3", input="x")
    status, _, body = await post(stack, "/gate/v1/residents/ollama/bge-m3/evict")
    assert status == 202, body
    assert body["key"]["model"] == "bge-m3:latest"
    assert any(e.model == "bge-m3:latest" for e in events_of(stack, EventKind.OUT_OF_BAND_RESIDENT))


async def test_a_drained_consumer_fails_new_demands_and_finishes_in_flight_ones(stack):
    drained = stack.next_event(EventKind.CONSUMER_DRAINED, consumer="ollama")
    body = {"model": "llama3.2:3b", "prompt": "go", "options": {"num_predict": 200}}
    async with (
        aiohttp.ClientSession() as session,
        session.post(stack.gate_url + "/api/generate", json=body) as streaming,
    ):
        assert streaming.status == 200
        await streaming.content.readline()
        status, _, state = await post(stack, "/gate/v1/consumers/ollama/drain")
        assert status == 200 and state["draining"] is True and state["drained"] is False
        async with session.post(
            stack.gate_url + "/api/embed", json={"model": "bge-m3", "input": "x"}
        ) as refused:
            assert refused.status == 503
            assert refused.headers["X-GPUGate-Failure"] == "RESIDENCY_CONFLICT"
            assert int(refused.headers["Retry-After"]) >= 1
            assert "consumer ollama is draining" in (await refused.text())
        lines = [json.loads(line) async for line in streaming.content if line.strip()]
        assert lines[-1]["done"] is True
    await asyncio.wait_for(drained, 10)
    async with (
        aiohttp.ClientSession() as session,
        session.get(stack.control_url + "/gate/v1/consumers/ollama") as resp,
    ):
        state = await resp.json()
    assert {k: state[k] for k in ("consumer", "gpu", "draining", "drained", "leases")} == {
        "consumer": "ollama",
        "gpu": 0,
        "draining": True,
        "drained": True,
        "leases": 0,
    }
    assert state["draining_by"] == "token" and state["undo"] == "gpugate undrain ollama"
    assert stack.gate.core.leases() == [] and stack.gate.core.waiting() == []
    started = events_of(stack, EventKind.CONSUMER_DRAINING)[-1]
    assert "asked by token" in started.detail
    status, _, state = await post(stack, "/gate/v1/consumers/ollama/undrain")
    assert status == 200 and state["draining"] is False
    await embed(stack)
    assert "asked by token" in events_of(stack, EventKind.CONSUMER_UNDRAINED)[-1].detail


async def test_a_paused_gpu_queues_demands_until_resume(stack):
    status, _, body = await post(stack, "/gate/v1/gpus/0/pause")
    assert status == 200 and (body["gpu"], body["paused"], body["paused_by"]) == (0, True, "token")
    queued = stack.next_event(EventKind.TICKET_QUEUED)
    waiting = asyncio.create_task(embed(stack))
    await asyncio.wait_for(queued, 10)
    assert len(stack.gate.core.waiting(0)) == 1 and not waiting.done()
    granted = stack.next_event(EventKind.LEASE_GRANTED)
    status, _, body = await post(stack, "/gate/v1/gpus/0/resume")
    assert status == 200 and (body["gpu"], body["paused"], body["paused_by"]) == (0, False, None)
    await asyncio.wait_for(granted, 10)
    await asyncio.wait_for(waiting, 10)
    assert stack.gate.core.leases() == [] and stack.gate.core.waiting() == []
    paused = events_of(stack, EventKind.GPU_PAUSED)[-1]
    resumed = events_of(stack, EventKind.GPU_RESUMED)[-1]
    assert paused.gpu == 0 and "asked by token" in paused.detail
    assert resumed.gpu == 0 and "asked by token" in resumed.detail
    status, _, body = await post(stack, "/gate/v1/gpus/7/pause")
    assert status == 404


async def test_operator_actions_are_in_the_event_stream(stack):
    await post(stack, "/gate/v1/gpus/0/pause")
    await post(stack, "/gate/v1/gpus/0/resume")
    async with (
        aiohttp.ClientSession() as session,
        session.get(stack.control_url + "/gate/v1/events") as resp,
    ):
        lines = [json.loads(line) for line in (await resp.text()).splitlines()]
    kinds = [line["event"] for line in lines]
    assert "gpu_paused" in kinds and "gpu_resumed" in kinds
    paused = [line for line in lines if line["event"] == "gpu_paused"]
    assert all("asked by token" in line["detail"] for line in paused)


async def test_the_cli_pauses_resumes_drains_and_evicts(stack, tmp_path, monkeypatch):
    from tests.control.conftest import CONTROL_TOKEN
    from tests.control.test_views_cli import gpugate

    monkeypatch.setenv("GPUGATE_TOKEN", CONTROL_TOKEN)
    code, out, err = await gpugate(stack, tmp_path, "pause")
    assert (code, out, err) == (0, "GPU 0: paused\n", "")
    assert stack.gate.core.operator.paused() == [0]
    code, out, _ = await gpugate(stack, tmp_path, "resume", "--gpu", "0")
    assert (code, out) == (0, "GPU 0: admitting\n")
    code, out, _ = await gpugate(stack, tmp_path, "drain", "ollama")
    assert (code, out) == (0, "ollama: drained (0 lease(s) in flight)\n")
    code, out, _ = await gpugate(stack, tmp_path, "undrain", "ollama")
    assert (code, out) == (0, "ollama: admitting (0 lease(s) in flight)\n")
    code, out, err = await gpugate(stack, tmp_path, "evict", "ollama", "no-such-model")
    assert code == Exit.DATAERR and out == ""
    assert err.startswith("gpugate evict: NOT_FOUND: no resident") and err.count("\n") == 1
    await embed(stack)
    done = stack.next_event(EventKind.EVICTION_DONE, reason="operator")
    code, out, _ = await gpugate(stack, tmp_path, "evict", "ollama", "bge-m3:latest", "--force")
    assert (code, out) == (0, "evicting ollama/bge-m3:latest (eviction_done follows)\n")
    await asyncio.wait_for(done, 10)
    assert stack.gate.core.leases() == [] and stack.gate.core.waiting() == []
    # Evicting it again (the README's command after the demo evicted it) asks for what is
    # already so: done, nothing unloaded.
    evictions = len(events_of(stack, EventKind.EVICTION_STARTED))
    code, out, err = await gpugate(stack, tmp_path, "evict", "ollama", "bge-m3:latest")
    assert (code, out, err) == (0, "ollama/bge-m3:latest is not loaded: nothing to evict\n", "")
    assert len(events_of(stack, EventKind.EVICTION_STARTED)) == evictions


async def test_the_cli_without_a_token_is_one_line_and_a_failure(stack, tmp_path, monkeypatch):
    from tests.control.test_views_cli import gpugate

    monkeypatch.delenv("GPUGATE_TOKEN", raising=False)
    code, out, err = await gpugate(stack, tmp_path, "drain", "ollama")
    assert code == Exit.NOPERM and out == "" and err.startswith("gpugate drain: UNAUTHORIZED: ")
    assert err.count("\n") == 1
    assert stack.gate.core.operator.draining("ollama") == (False, False)
