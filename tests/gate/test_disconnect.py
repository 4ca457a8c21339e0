"""A client that goes away frees its lease at once and the upstream stops working for it."""

from __future__ import annotations

import asyncio

import aiohttp
import attrs
import pytest

from gpugate.core.effects import EventKind
from tests.gate.harness import MODELS, running_stack

SLOW = tuple(attrs.evolve(m, tokens_per_second=5.0) for m in MODELS)


@pytest.fixture
async def slow_stack(tmp_path, sim_host, fakenvml_path):
    async with running_stack(tmp_path, sim_host, fakenvml_path, models=SLOW) as stack:
        yield stack


async def test_disconnect_mid_stream_frees_the_lease_within_100ms_and_stops_generation(
    slow_stack,
):
    stack = slow_stack
    sim = stack.sim
    async with aiohttp.ClientSession() as session:
        response = await session.post(
            stack.gate_url + "/api/generate",
            json={"model": "llama3.2:3b", "prompt": "tell me a long story"},
        )
        assert response.status == 200
        first = await response.content.readline()
        assert b'"response"' in first
        lease_id = int(response.headers["X-GPUGate-Lease"])
        assert stack.gate.core.lease(lease_id) is not None
        released = stack.next_event(EventKind.LEASE_RELEASED, model="llama3.2:3b")
        gone_at = stack.gate.clock()
        response.close()  # the client goes away mid-stream
        event = await asyncio.wait_for(released, 5)
    assert event.time - gone_at < 0.1
    assert stack.gate.core.lease(lease_id) is None
    state = await sim.wait_until(lambda s: s.counters.generations_cancelled == 1, timeout=5)
    assert state.counters.generations_completed == 0
    runner = state.runner("llama3.2:3b")
    assert runner is not None and runner.refcount == 0  # still loaded, now idle


async def test_disconnect_while_waiting_for_a_lease_leaves_no_ticket(slow_stack):
    stack = slow_stack
    async with aiohttp.ClientSession() as session:
        # llama and qwen stream (8,900 MiB busy); gemma (7,796) does not fit in the 6,026
        # left and its peers may not be evicted while busy: it waits.
        busy = []
        for model in ("llama3.2:3b", "qwen2.5:7b"):
            response = await session.post(
                stack.gate_url + "/api/generate", json={"model": model, "prompt": "hold on"}
            )
            await response.content.readline()
            busy.append(response)
        queued = stack.next_event(EventKind.TICKET_QUEUED, model="gemma3:12b")
        cancelled = stack.next_event(EventKind.TICKET_CANCELLED, model="gemma3:12b")
        waiting = asyncio.create_task(
            session.post(
                stack.gate_url + "/api/generate", json={"model": "gemma3:12b", "prompt": "x"}
            )
        )
        await queued
        assert [t.demand.model for t in stack.gate.core.waiting()] == ["gemma3:12b"]
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        event = await asyncio.wait_for(cancelled, 5)
        assert event.detail == "its client went away"
        assert stack.gate.core.waiting() == []
        for response in busy:
            response.close()
    assert "gemma3:12b" not in [m["name"] for m in await stack.ps()]
    assert stack.sim.state().counters.loads == 2


async def test_disconnect_during_a_load_aborts_it_and_frees_the_lease(
    tmp_path, sim_host, fakenvml_path
):
    slow_load = tuple(
        attrs.evolve(m, load_seconds=5.0) if m.name == "qwen2.5:7b" else m for m in MODELS
    )
    async with running_stack(tmp_path, sim_host, fakenvml_path, models=slow_load) as stack:
        released = stack.next_event(EventKind.LEASE_RELEASED, model="qwen2.5:7b")
        async with aiohttp.ClientSession() as session:
            request = asyncio.create_task(
                session.post(
                    stack.gate_url + "/api/generate", json={"model": "qwen2.5:7b", "prompt": "x"}
                )
            )
            await stack.sim.wait_until(
                lambda s: any(r.phase.value == "loading" for r in s.runners), timeout=10
            )
            request.cancel()  # the client gives up while the model is still loading
            with pytest.raises(asyncio.CancelledError):
                await request
        event = await asyncio.wait_for(released, 5)
        assert event.reason == "failed"  # the load never completed
        state = await stack.sim.wait_until(lambda s: s.counters.loads_aborted == 1, timeout=10)
        assert state.counters.loads == 0 and state.runners == ()
        assert stack.gate.core.leases() == [] and stack.gate.core.residents() == []
        assert stack.gate.core.budget(0).consumer("ollama").pending == 0
