"""A prompt only ComfyUI can judge (a custom node's own VALIDATE_INPUTS) through the gate.

It is leased before it goes up only when memory is free for it (nobody evicted); otherwise
it goes up with no lease and is leased once ComfyUI accepts it, evicting as any job does,
while ComfyUI may already be running it (`gpugate.core.early`). When that lease cannot be
had, or its client leaves while it waits, the prompt is withdrawn from ComfyUI (deleted if
pending, interrupted if running), what it loaded is given back, and the client gets the
gate's failure in ComfyUI's shape.
"""

from __future__ import annotations

import asyncio

import aiohttp
import pytest

from gpugate.core.classes import PriorityClass, ResidencyPolicy
from gpugate.core.effects import Event, EventKind
from gpugate.core.residents import ResidentKey
from gpugate.core.scopes import HELD_MODEL
from gpugate.core.tickets import Demand
from gpugate.core.units import GiB, MiB
from gpugate.gate.exchange import FAILURE_HEADER, LEASE_HEADER
from tests.gate.comfyui_stack import comfy_stack
from tests.sim.comfyui_helpers import connect, flux, txt2img

SD15_JOB = 2034 * MiB + 256 * MiB
"""What the gate leases for `checked()`: SD1.5's checkpoint and its working set at 512²."""


def checked(seed: int = 1, steps: int = 3, text: str = "a cat") -> dict:
    """SD1.5's txt2img whose positive prompt goes through CheckedTextEncode: only ComfyUI
    can run its VALIDATE_INPUTS, so the gate leaves the verdict to ComfyUI."""
    graph = txt2img(seed=seed, steps=steps)
    graph["6"] = {"class_type": "CheckedTextEncode", "inputs": {"text": text, "clip": ["4", 1]}}
    return graph


def checked_flux(size: int = 1024) -> dict:
    """FLUX.1-dev (about 17 GiB: more than the 16 GiB card) through CheckedTextEncode."""
    graph = flux()
    graph["4"] = {"class_type": "CheckedTextEncode", "inputs": {"text": "a fox", "clip": ["2", 0]}}
    graph["6"]["inputs"] |= {"width": size, "height": size}
    return graph


@pytest.fixture
async def stack(tmp_path, sim_host, fakenvml_path):
    async with comfy_stack(
        tmp_path, sim_host, fakenvml_path, custom_nodes=("checked_nodes",)
    ) as stack:
        yield stack


@pytest.fixture
async def session():
    async with aiohttp.ClientSession() as http:
        yield http


@pytest.fixture
async def transcoder():
    """A process outside the gate that a test gives memory to."""
    process = await asyncio.create_subprocess_exec("sleep", "600")
    yield process
    process.kill()
    await process.wait()


def comfy_leases(gate):
    return [x for x in gate.core.leases() if x.key.consumer == "comfyui"]


def record(gate) -> list[Event]:
    seen: list[Event] = []
    gate.events.subscribe(seen.append, routine=True)
    return seen


def of(seen: list[Event], kind: EventKind, consumer: str | None = None) -> list[Event]:
    return [e for e in seen if e.kind is kind and consumer in (None, e.consumer)]


async def load(stack, session, *models: str) -> None:
    for model in models:
        route, body = (
            ("/api/embed", {"model": model, "input": "hi"})
            if model == "bge-m3"
            else ("/api/generate", {"model": model, "prompt": "hi", "stream": False})
        )
        async with session.post(f"{stack.gate_ollama}{route}", json=body) as resp:
            assert resp.status == 200, await resp.text()


async def fill_the_card(stack, sim_host, session, transcoder) -> None:
    """gemma3:12b (production), an idle bge-m3 (background) and a 3.4 GiB transcoder:
    1.4 GiB schedulable, 2.4 GiB free on the card (the reserve is 1 GiB)."""
    await load(stack, session, "gemma3:12b", "bge-m3")
    sim_host.allocate(transcoder.pid, 3500 * MiB, name="Plex Transcoder")
    await sample(stack)
    budget = stack.gate.core.budget(0)
    assert budget is not None and 1 * GiB < budget.schedulable < SD15_JOB


async def sample(stack) -> None:
    stack.gate.observe(await stack.gate.sampler.sample())


async def post(session, url, graph, **fields):
    async with session.post(f"{url}/prompt", json={"prompt": graph, **fields}) as resp:
        return resp.status, resp.headers, await resp.json(content_type=None)


async def history(session, stack, prompt_id):
    async with session.get(f"{stack.direct_comfy}/history/{prompt_id}") as resp:
        assert resp.status == 200
        return (await resp.json()).get(prompt_id)


async def queue_ids(session, stack) -> list[str]:
    async with session.get(f"{stack.direct_comfy}/queue") as resp:
        data = await resp.json()
    return [item[1] for part in ("queue_running", "queue_pending") for item in data[part]]


async def withdrawals_done(gate) -> None:
    """Wait for the withdrawals under way (each started before its client's answer)."""
    tasks = [t for t in gate._tasks if t.get_name().startswith("gpugate-withdraw-")]
    await asyncio.wait_for(asyncio.gather(*tasks), 20)


async def stop_comfy_jobs(stack, session) -> None:
    """Interrupt what ComfyUI runs and wait for the job lease to end with it."""
    ended = stack.next_event(EventKind.LEASE_RELEASED, reason="jobs done")
    async with session.post(f"{stack.gate_comfy}/interrupt", json={}) as resp:
        assert resp.status == 200
    await asyncio.wait_for(ended, 20)


# -- memory free: leased before it goes up -------------------------------------------------


async def test_with_memory_free_it_is_leased_before_it_goes_up(stack, session):
    seen = record(stack.gate)
    ended = stack.next_event(EventKind.LEASE_RELEASED, reason="jobs done")
    status, headers, answer = await post(session, stack.gate_comfy, checked())
    assert status == 200, answer
    assert LEASE_HEADER in headers
    await asyncio.wait_for(ended, 20)
    # Granted at once, from free memory: it never waited in the queue, nobody was evicted.
    assert of(seen, EventKind.TICKET_QUEUED) == []
    assert of(seen, EventKind.EVICTION_STARTED) == []
    assert (await history(session, stack, answer["prompt_id"]))["status"]["status_str"] == (
        "success"
    )
    assert comfy_leases(stack.gate) == []


async def test_with_memory_free_a_refusal_ends_its_lease_at_once(stack, session):
    seen = record(stack.gate)
    status, headers, answer = await post(session, stack.gate_comfy, checked(text="  "))
    assert status == 400
    assert answer["error"]["type"] == "prompt_outputs_failed_validation"
    assert answer["node_errors"]["6"]["errors"][0]["type"] == "custom_validation_failed"
    # It held free memory while ComfyUI judged it, and nothing else.
    assert LEASE_HEADER in headers
    assert [e.reason for e in of(seen, EventKind.LEASE_RELEASED, "comfyui")][-1] == "jobs done"
    assert of(seen, EventKind.EVICTION_STARTED) == []
    assert comfy_leases(stack.gate) == []


# -- the card full: leased once ComfyUI accepts it -----------------------------------------


async def test_a_refusal_with_the_card_full_costs_no_lease_and_no_eviction(
    stack, sim_host, session, transcoder
):
    await fill_the_card(stack, sim_host, session, transcoder)
    seen = record(stack.gate)
    status, headers, answer = await post(session, stack.gate_comfy, checked(text="  "))
    assert status == 400
    assert answer["error"]["type"] == "prompt_outputs_failed_validation"
    assert LEASE_HEADER not in headers
    assert of(seen, EventKind.LEASE_GRANTED) == []
    assert of(seen, EventKind.EVICTION_STARTED) == []
    assert comfy_leases(stack.gate) == []


async def test_an_accepted_prompt_is_leased_evicting_an_idle_resident_and_ends_with_its_job(
    stack, sim_host, session, transcoder
):
    gate = stack.gate
    await fill_the_card(stack, sim_host, session, transcoder)
    seen = record(gate)
    ws = await connect(session, stack.gate_comfy, "t1")
    ended = stack.next_event(EventKind.LEASE_RELEASED, reason="jobs done")
    status, headers, answer = await post(session, stack.gate_comfy, checked(), client_id="t1")
    assert status == 200, answer
    assert LEASE_HEADER in headers
    prompt_id = answer["prompt_id"]
    # Queued for its lease only once ComfyUI had accepted it, then bge-m3 made room.
    [queued] = of(seen, EventKind.TICKET_QUEUED, "comfyui")
    assert [e.key.model for e in of(seen, EventKind.EVICTION_STARTED)] == ["bge-m3:latest"]
    [granted] = of(seen, EventKind.LEASE_GRANTED, "comfyui")
    assert granted.key == queued.key and granted.bytes == SD15_JOB
    events = await ws.until_done(prompt_id)
    assert "execution_success" in [e["type"] for e in events]
    await asyncio.wait_for(ended, 20)
    assert (await history(session, stack, prompt_id))["status"]["status_str"] == "success"
    assert comfy_leases(gate) == []
    assert gate.core.waiting() == []
    assert gate.core.scheduler.withdrawing == {}
    # What ComfyUI kept is a resident like after any job; gemma3:12b was never touched.
    residents = {r.key.model for r in gate.core.residents()}
    assert residents == {HELD_MODEL, "gemma3:12b"}
    assert sim_host.ooms() == []
    await ws.ws.close()


async def test_a_demand_meanwhile_is_not_granted_the_memory_the_prompt_is_taking(
    stack, sim_host, session, transcoder
):
    """ComfyUI runs the prompt before its lease: a production demand arriving then is
    planned after it, and the card is never over-committed."""
    gate = stack.gate
    await fill_the_card(stack, sim_host, session, transcoder)
    seen = record(gate)
    ws = await connect(session, stack.gate_comfy, "t3")
    # Admission on the card waits: the window between acceptance and lease stays open.
    gate.pause(0)
    queued = stack.next_event(EventKind.TICKET_QUEUED)
    answer = asyncio.create_task(
        post(session, stack.gate_comfy, checked(steps=10_000), client_id="t3")
    )
    await asyncio.wait_for(queued, 20)
    await ws.until("progress")  # its weights and working set are on the card
    await sample(stack)
    early = gate.core.budget(0).consumer("comfyui")
    # As much of the checkpoint as the full card holds beside the working set and the
    # reserve: ComfyUI loads the rest of it partly (lowvram), where it used to load all.
    assert early.unexplained >= 1 * GiB and early.pending == 0
    probe = Demand(
        ResidentKey("ollama", "probe"),
        0,
        1 * GiB,
        PriorityClass.PRODUCTION,
        PriorityClass.PRODUCTION,
        ResidencyPolicy.KEEP_WARM,
        None,
    )
    probe_queued = stack.next_event(EventKind.TICKET_QUEUED, consumer="ollama")
    meanwhile = asyncio.create_task(gate.leases.acquire(probe))
    await asyncio.wait_for(probe_queued, 20)
    assert [t.demand.consumer for t in gate.core.waiting(0)] == ["comfyui", "ollama"]
    gate.resume(0)
    status, _, body = await asyncio.wait_for(answer, 20)
    assert status == 200, body
    lease = await asyncio.wait_for(meanwhile, 20)
    granted = [e.consumer for e in of(seen, EventKind.LEASE_GRANTED)]
    assert granted == ["comfyui", "ollama"]
    await sample(stack)
    budget = gate.core.budget(0)
    assert budget.schedulable >= 0
    # ComfyUI's memory is its lease's now, counted once.
    row = budget.consumer("comfyui")
    assert row.pending == SD15_JOB and row.unexplained < 300 * MiB
    assert [e.key.model for e in of(seen, EventKind.EVICTION_STARTED)] == ["bge-m3:latest"]
    gate.leases.release(lease)
    await stop_comfy_jobs(stack, session)
    assert comfy_leases(gate) == []
    assert sim_host.ooms() == []
    await ws.ws.close()


# -- the lease cannot be had: withdrawn ----------------------------------------------------


async def test_a_running_prompt_whose_lease_cannot_be_had_is_interrupted_and_given_back(
    stack, sim_host, session, transcoder
):
    gate = stack.gate
    # gemma3:12b (production: an interactive prompt may not evict it) and a transcoder:
    # 0.75 GiB schedulable, 1.75 GiB free: not even the prompt's 0.9 GiB floor (its
    # checkpoint partly loaded, 128 MiB, and ComfyUI's least working memory). ComfyUI starts
    # the prompt as it accepts it.
    await load(stack, session, "gemma3:12b")
    sim_host.allocate(transcoder.pid, 6144 * MiB, name="Plex Transcoder")
    await sample(stack)
    seen = record(gate)
    ws = await connect(session, stack.gate_comfy, "t2")
    given_back = stack.next_event(EventKind.EVICTION_DONE, model=HELD_MODEL)
    status, headers, answer = await post(
        session, stack.gate_comfy, checked(steps=10_000), client_id="t2"
    )
    assert status == 503, answer
    assert headers[FAILURE_HEADER] == "DEADLINE_CANNOT_BE_MET"
    assert set(answer) == {"error", "node_errors"} and answer["node_errors"] == {}
    assert answer["error"]["type"] == "deadline_cannot_be_met"
    assert LEASE_HEADER not in headers
    interrupted = await ws.until("execution_interrupted")
    prompt_id = interrupted["data"]["prompt_id"]
    assert prompt_id not in await queue_ids(session, stack)
    entry = await history(session, stack, prompt_id)
    assert entry["status"]["status_str"] == "error"
    # What it loaded was given back with /free, and ComfyUI holds its context only.
    await asyncio.wait_for(given_back, 20)
    [evicted] = of(seen, EventKind.EVICTION_STARTED)
    assert evicted.key.model == HELD_MODEL and evicted.reason == "withdrawn"
    await sample(stack)
    assert gate.core.observation(0).managed["comfyui"] <= 210 * MiB
    assert comfy_leases(gate) == [] and gate.core.waiting() == []
    assert gate.core.scheduler.withdrawing == {}
    assert [r.key.model for r in gate.core.residents()] == ["gemma3:12b"]
    assert sim_host.ooms() == []
    await ws.ws.close()


async def test_a_pending_prompt_whose_lease_cannot_be_had_is_deleted_and_never_runs(
    stack, sim_host, session, transcoder
):
    gate = stack.gate
    await load(stack, session, "gemma3:12b")
    ws = await connect(session, stack.gate_comfy, "t4")
    # A long prompt the gate judges runs, leased; the one behind it waits in ComfyUI's queue.
    status, _, running = await post(
        session, stack.gate_comfy, txt2img(steps=10_000), client_id="t4"
    )
    assert status == 200, running
    await ws.until("progress")
    # A transcoder takes 3 GiB: not even the 2048x2048 FLUX's floor (128 MiB of each text
    # encoder and its 4 GiB working set) fits in the running job's lease and what is left.
    sim_host.allocate(transcoder.pid, 3 * GiB, name="Plex Transcoder")
    await sample(stack)
    seen = record(gate)
    status, headers, answer = await post(session, stack.gate_comfy, checked_flux(2048))
    assert status == 503, answer
    # gemma3:12b is production (never the prompt's to evict) and kept for 15 minutes.
    assert headers[FAILURE_HEADER] == "DEADLINE_CANNOT_BE_MET", answer
    assert answer["error"]["type"] == "deadline_cannot_be_met"
    # The whole graph can never be had beside it; its floor (the UNet's stage) only later.
    details = answer["error"]["details"]
    assert "its floor of" in details and "its ceiling: " in details, details
    await withdrawals_done(gate)
    # Deleted from ComfyUI's queue: only the first prompt is there.
    assert await queue_ids(session, stack) == [running["prompt_id"]]
    assert of(seen, EventKind.EVICTION_STARTED) == []
    assert gate.core.scheduler.withdrawing == {}
    assert len(gate.jobs.live("comfyui")) == 1
    await stop_comfy_jobs(stack, session)
    assert comfy_leases(gate) == []
    assert sim_host.ooms() == []
    await ws.ws.close()


async def test_a_client_leaving_while_its_accepted_prompt_waits_withdraws_it(
    stack, sim_host, session
):
    gate = stack.gate
    ws = await connect(session, stack.gate_comfy, "t5")
    gate.pause(0)
    queued = stack.next_event(EventKind.TICKET_QUEUED)
    cancelled = stack.next_event(EventKind.TICKET_CANCELLED)
    waiting = asyncio.create_task(
        post(session, stack.gate_comfy, checked(steps=10_000), client_id="t5")
    )
    await asyncio.wait_for(queued, 20)
    started = await ws.until("execution_start")
    prompt_id = started["data"]["prompt_id"]
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    event = await asyncio.wait_for(cancelled, 20)
    assert event.detail == "its client went away"
    await withdrawals_done(gate)
    interrupted = await ws.until("execution_interrupted")
    assert interrupted["data"]["prompt_id"] == prompt_id
    assert prompt_id not in await queue_ids(session, stack)
    gate.resume(0)
    assert gate.core.waiting() == [] and comfy_leases(gate) == []
    assert gate.core.scheduler.withdrawing == {}
    assert sim_host.ooms() == []
    await ws.ws.close()
