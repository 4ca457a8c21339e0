"""A ComfyUI job lease over the runtime's life: a ComfyUI that dies mid-prompt loses its
jobs, and a prompt that ran well leaves its NVML peak as the envelope of its file set."""

from __future__ import annotations

import asyncio
import os
import signal
import sqlite3
import urllib.parse

import aiohttp
import pytest

from gpugate.core.effects import Event, EventKind
from gpugate.core.failures import FailureClass
from gpugate.core.job_leases import JOBS_MODEL
from gpugate.core.units import MiB
from gpugate.gate.exchange import LEASE_HEADER
from gpugate.runtimes.comfyui.envelope import PROMPT_OPTIONS
from gpugate_sim.comfyui import SimComfyUI
from gpugate_sim.comfyui.work import CHECKPOINT_SHARES
from tests.gate.comfyui_stack import comfy_stack
from tests.sim.comfyui_helpers import SD15, connect, txt2img


@pytest.fixture
async def stack(tmp_path, sim_host, fakenvml_path):
    async with comfy_stack(tmp_path, sim_host, fakenvml_path) as stack:
        yield stack


@pytest.fixture
async def session():
    async with aiohttp.ClientSession() as http:
        yield http


async def post_prompt(session, url, graph, **fields):
    async with session.post(f"{url}/prompt", json={"prompt": graph, **fields}) as resp:
        return resp.status, resp.headers, await resp.json(content_type=None)


def carriers(gate):
    return [x for x in gate.core.leases() if x.key.model == JOBS_MODEL]


def crashed(event: Event) -> bool:
    failure = event.failure
    return (
        event.kind is EventKind.FAILURE
        and failure is not None
        and failure.failure_class is FailureClass.RUNTIME_CRASH
        and failure.consumer == "comfyui"
    )


async def test_a_comfyui_that_dies_mid_prompt_ends_its_jobs_and_a_new_one_is_admitted(
    stack, session, sim_host
):
    gate = stack.gate
    ws = await connect(session, stack.gate_comfy, "c1")
    # 10,000 steps (ComfyUI's most) at 200 a second: running when it dies.
    status, _, _ = await post_prompt(
        session, stack.gate_comfy, txt2img(steps=10_000), client_id="c1"
    )
    assert status == 200
    _, _, pending = await post_prompt(session, stack.gate_comfy, txt2img(seed=2))
    await ws.until("progress")
    assert len(gate.jobs.live("comfyui")) == 2
    lost = gate.events.next(crashed)
    # SIGKILL: the driver takes its memory back, and nothing answers at its port.
    os.kill(stack.comfy.pid, signal.SIGKILL)
    await stack.comfy.close()
    event = await asyncio.wait_for(lost, 10)
    assert event.failure is not None and event.failure.message.endswith("its jobs are lost")
    assert gate.jobs.live("comfyui") == []
    assert gate.core.leases() == []
    assert gate.core.waiting() == []
    await ws.ws.close()

    # ComfyUI is back on the same port: a prompt is admitted and runs as before.
    port = urllib.parse.urlsplit(stack.comfy.url).port
    stack.comfy = SimComfyUI(stack.comfy.spec, sim_host)
    await stack.comfy.start("127.0.0.1", port)
    ended = gate.events.next(
        lambda e: e.kind is EventKind.LEASE_RELEASED and e.reason == "jobs done"
    )
    status, headers, answer = await post_prompt(session, stack.gate_comfy, txt2img(seed=3))
    assert status == 200, answer
    assert LEASE_HEADER in headers
    assert answer["prompt_id"] != pending["prompt_id"]
    assert [x.pending for x in carriers(gate)] == [(2034 + 256) * MiB]
    await asyncio.wait_for(ended, 10)
    assert gate.core.leases() == []
    assert not [e for e in gate.recent_events() if crashed(e) and e.time > event.time]


async def test_a_prompts_measured_peak_is_its_file_sets_envelope_next_time(
    stack, session, tmp_path
):
    gate = stack.gate
    graph = txt2img(steps=100)  # half a second of sampling: NVML is sampled at its peak
    ended = gate.events.next(
        lambda e: e.kind is EventKind.LEASE_RELEASED and e.reason == "jobs done"
    )
    status, _, answer = await post_prompt(session, stack.gate_comfy, graph)
    assert status == 200, answer
    # Configured: the checkpoint and 1 GiB per megapixel at 512x512.
    assert [x.pending for x in carriers(gate)] == [(2034 + 256) * MiB]
    await asyncio.wait_for(ended, 10)

    # Its peak, while sampling: the CUDA context, the checkpoint's UNet and text encoder
    # (its VAE comes on the card only to decode, once the working set is gone), and the
    # working set.
    weights = sum(int(2034 * MiB * share) for _, share in CHECKPOINT_SHARES)
    peak = 210 * MiB + weights + 256 * MiB
    await gate.store.flush()
    with sqlite3.connect(tmp_path / "gpugate.db") as db:
        rows = db.execute("SELECT consumer, model, options, bytes, scale FROM envelopes").fetchall()
    assert rows == [("comfyui", SD15, PROMPT_OPTIONS, peak, 0.25)]

    # The same graph again (another seed: nothing served from ComfyUI's cache): the
    # measured peak wins over the configured files.
    graph["3"]["inputs"]["seed"] = 2
    ended = gate.events.next(
        lambda e: e.kind is EventKind.LEASE_RELEASED and e.reason == "jobs done"
    )
    status, _, answer = await post_prompt(session, stack.gate_comfy, graph)
    assert status == 200, answer
    assert [x.pending for x in carriers(gate)] == [peak]
    await asyncio.wait_for(ended, 10)
    assert gate.core.leases() == []
    assert gate.core.waiting() == []
