"""The simulated ComfyUI running prompts: websocket events, interrupts, VRAM, OOM, /free."""

from __future__ import annotations

import json
import os
import struct

import aiohttp

from gpugate.core.units import MiB
from gpugate_sim.comfyui import SimComfyUI
from gpugate_sim.comfyui.memory import Part
from gpugate_sim.device import SimulatedGpuHost
from tests.sim.comfyui_helpers import (
    blank,
    comfy,
    connect,
    flux,
    kinds,
    make_comfy,
    queue,
    session,
    txt2img,
)

__all__ = ["comfy", "make_comfy", "session"]
CONTEXT = 210 * MiB


async def test_fresh_run_then_cached_rerun(comfy: SimComfyUI, session: aiohttp.ClientSession):
    socket = await connect(session, comfy.url, "me")
    prompt_id = await queue(session, comfy.url, blank(), client_id="me")
    events = await socket.until_done(prompt_id)
    assert kinds(events) == [
        "status", "status", "execution_start", "execution_cached",
        "progress_state", "executing", "progress_state",
        "progress_state", "executing", "executed", "progress_state",
        "execution_success", "status", "executing",
    ]  # fmt: skip
    assert [e["data"]["status"]["exec_info"]["queue_remaining"] for e in events
            if e["type"] == "status"] == [1, 1, 0]  # fmt: skip
    assert events[3]["data"]["nodes"] == []
    assert [e["data"]["node"] for e in events if e["type"] == "executing"] == ["1", "2", None]
    executed = events[9]["data"]
    assert executed == {
        "node": "2", "display_node": "2", "prompt_id": prompt_id,
        "output": {"images": [{"filename": "blank_00001_.png", "subfolder": "", "type": "output"}]},
    }  # fmt: skip
    assert events[-1]["data"] == {"node": None, "prompt_id": prompt_id}

    again = await queue(session, comfy.url, blank(), client_id="me")
    events = await socket.until_done(again)
    assert kinds(events) == [
        "status", "status", "execution_start", "execution_cached", "executed", "progress_state",
        "execution_success", "status", "executing",
    ]  # fmt: skip
    assert events[3]["data"]["nodes"] == ["1", "2"]
    assert events[4]["data"]["output"] == executed["output"]


async def test_stock_txt2img_progress_and_previews(
    comfy: SimComfyUI, session: aiohttp.ClientSession
):
    plain = await connect(session, comfy.url, "plain")
    prompt_id = await queue(session, comfy.url, txt2img(steps=3), client_id="plain")
    events = await plain.until_done(prompt_id)
    assert [e["data"]["node"] for e in events if e["type"] == "executing"] == [
        "4", "5", "7", "6", "3", "8", "9", None,
    ]  # fmt: skip
    progress = [e["data"] for e in events if e["type"] == "progress"]
    assert [(p["value"], p["max"], p["node"]) for p in progress] == [(1, 3, "3"), (2, 3, "3"),
                                                                       (3, 3, "3")]  # fmt: skip
    assert len(plain.binary) == 3
    assert all(f[:8] == struct.pack(">II", 1, 1) and f[8:10] == b"\xff\xd8" for f in plain.binary)

    # A client announcing supports_preview_metadata gets type 4 frames instead.
    rich = await connect(session, comfy.url, "rich")
    await rich.ws.send_json({"type": "feature_flags", "data": {"supports_preview_metadata": True}})
    flags = await rich.event()
    assert flags == {"type": "feature_flags", "data": {
        "supports_preview_metadata": True, "max_upload_size": 104857600.0}}  # fmt: skip
    prompt_id = await queue(session, comfy.url, txt2img(seed=2, steps=2), client_id="rich")
    await rich.until_done(prompt_id)
    assert len(rich.binary) == 2
    (kind, length) = struct.unpack(">II", rich.binary[0][:8])
    metadata = json.loads(rich.binary[0][8 : 8 + length])
    assert kind == 4
    assert metadata["prompt_id"] == prompt_id and metadata["image_type"] == "image/jpeg"


async def test_newest_socket_of_a_client_id_takes_over(
    comfy: SimComfyUI, session: aiohttp.ClientSession
):
    old = await connect(session, comfy.url, "same", autoping=False)
    new = await connect(session, comfy.url, "same", autoping=False)
    prompt_id = await queue(session, comfy.url, blank(), client_id="same")
    await new.until_done(prompt_id)
    await comfy.hub.drained()
    # The old socket is still open and got nothing at all, not even status broadcasts.
    assert await old.nothing_pending()
    # Closing the old one unregisters the id: the live socket is orphaned.
    await old.ws.close()
    other = await connect(session, comfy.url, "other")
    prompt_id = await queue(session, comfy.url, blank(40), client_id="other")
    await other.until_done(prompt_id)
    await comfy.hub.drained()
    assert await new.nothing_pending()
    assert list(comfy.hub.sockets) == ["other"]


async def test_prompt_without_client_id_broadcasts_only_progress(
    comfy: SimComfyUI, session: aiohttp.ClientSession
):
    watcher = await connect(session, comfy.url, "watcher")
    prompt_id = await queue(session, comfy.url, txt2img(steps=2))
    seen = []
    while True:
        event = await watcher.event()
        seen.append(event["type"])
        if (
            event["type"] == "status"
            and event["data"]["status"]["exec_info"]["queue_remaining"] == 0
        ):
            break
    assert set(seen) == {"status", "progress_state", "progress"}
    assert len(watcher.binary) == 2
    async with session.get(f"{comfy.url}/history/{prompt_id}") as resp:
        assert (await resp.json())[prompt_id]["status"]["status_str"] == "success"


async def test_interrupt_takes_effect_at_the_next_node(make_comfy, session: aiohttp.ClientSession):
    comfy = await make_comfy(node_seconds=0.5)
    socket = await connect(session, comfy.url, "me")
    # While idle an interrupt is forgotten when the next prompt starts.
    async with session.post(f"{comfy.url}/interrupt") as resp:
        assert resp.status == 200 and await resp.read() == b""
    prompt_id = await queue(session, comfy.url, blank(), client_id="me")
    event = await socket.until("executing")
    assert event["data"]["node"] == "1"
    async with session.post(f"{comfy.url}/interrupt", json={"prompt_id": "someone-else"}):
        pass
    async with session.post(f"{comfy.url}/api/interrupt", json={"prompt_id": prompt_id}):
        pass
    events = await socket.until_done(prompt_id)
    interrupted = next(e["data"] for e in events if e["type"] == "execution_interrupted")
    assert (interrupted["node_id"], interrupted["node_type"], interrupted["executed"]) == (
        "2", "SaveImage", ["1"],
    )  # fmt: skip
    assert "execution_success" not in kinds(events)
    async with session.get(f"{comfy.url}/history/{prompt_id}") as resp:
        status = (await resp.json())[prompt_id]["status"]
    assert (status["status_str"], status["completed"]) == ("error", False)


async def test_interrupt_stops_a_sampler_between_steps(make_comfy, session: aiohttp.ClientSession):
    comfy = await make_comfy(steps_per_second=50.0)
    socket = await connect(session, comfy.url, "me")
    prompt_id = await queue(session, comfy.url, txt2img(steps=1000), client_id="me")
    first = await socket.until("progress")
    async with session.post(f"{comfy.url}/interrupt", data=b""):
        pass
    events = [first, *await socket.until_done(prompt_id)]
    interrupted = next(e["data"] for e in events if e["type"] == "execution_interrupted")
    assert interrupted["node_id"] == "3"
    assert max(e["data"]["value"] for e in events if e["type"] == "progress") < 1000
    assert comfy.vram.working == 0


async def test_weights_stay_until_free_between_prompts(
    make_comfy, session: aiohttp.ClientSession, sim_host: SimulatedGpuHost
):
    comfy = await make_comfy(steps_per_second=20.0)
    assert sim_host.read().held_by(comfy.pid, 0) == CONTEXT
    socket = await connect(session, comfy.url, "me")
    first = await queue(session, comfy.url, txt2img(steps=2), client_id="me")
    await socket.until_done(first)
    loaded = sim_host.read().held_by(comfy.pid, 0)
    assert loaded == CONTEXT + sum(part.size for part in comfy.vram.loaded) > CONTEXT + 1900 * MiB
    # /free during a prompt is acted on only once that prompt has finished.
    second = await queue(session, comfy.url, txt2img(seed=2, steps=20), client_id="me")
    await socket.until("progress")
    async with session.post(f"{comfy.url}/free", json={"unload_models": True}) as resp:
        assert resp.status == 200 and await resp.read() == b""
    assert sim_host.read().held_by(comfy.pid, 0) > loaded
    await socket.until_done(second)
    await comfy.wait_until(lambda: not comfy.queue.flags)
    assert sim_host.read().held_by(comfy.pid, 0) == CONTEXT
    # unload_models keeps the node cache: a re-run loads the weights again, runs no loader.
    third = await queue(session, comfy.url, txt2img(seed=2, steps=20), client_id="me")
    events = await socket.until_done(third)
    assert events[3]["data"]["nodes"] == ["4", "6", "7", "5", "3", "8", "9"]
    assert sim_host.read().held_by(comfy.pid, 0) == CONTEXT
    fourth = await queue(session, comfy.url, txt2img(seed=3, steps=2), client_id="me")
    events = await socket.until_done(fourth)
    # A new seed re-runs the sampler and the decoder; the cached prompts need no CLIP.
    assert events[3]["data"]["nodes"] == ["4", "6", "7", "5"]
    clip = int(2034 * MiB * 0.12)
    assert sim_host.read().held_by(comfy.pid, 0) == loaded - clip
    # free_memory drops the cache too: the loader runs again next time.
    async with session.post(f"{comfy.url}/free", json={"free_memory": True}):
        pass
    await comfy.wait_until(lambda: not comfy.queue.flags)
    assert sim_host.read().held_by(comfy.pid, 0) == CONTEXT
    fifth = await queue(session, comfy.url, txt2img(seed=3, steps=2), client_id="me")
    events = await socket.until_done(fifth)
    assert events[3]["data"]["nodes"] == []


async def test_flux_loads_partly_while_ollama_holds_the_card_then_whole(
    comfy: SimComfyUI, session: aiohttp.ClientSession, sim_host: SimulatedGpuHost
):
    # The incident card: whisper, mVoice and the two Ollama runners under this test's PID.
    others = (2050 + 292) * MiB
    ollama = (7796 + 2012) * MiB
    sim_host.allocate(os.getpid(), others + ollama, name="other")
    assert sim_host.free(0) == 3590 * MiB
    unet = Part("diffusion_models", "flux1-dev-fp8.safetensors", "model", 11350 * MiB)
    try:
        socket = await connect(session, comfy.url, "me")
        prompt_id = await queue(session, comfy.url, flux(), client_id="me")
        await socket.until("progress")
        # load_models_gpu keeps the working set (1 GiB at 1024x1024) and the 400 MiB
        # reserve free and puts as much of the UNet as the rest holds on the card.
        assert comfy.vram.loaded[unet] == 3590 * MiB - (1024 + 400) * MiB
        assert comfy.vram.offloaded([unet]) == 11350 * MiB - comfy.vram.loaded[unet]
        events = await socket.until_done(prompt_id)
        assert "execution_error" not in kinds(events)
        assert "execution_success" in kinds(events)
        assert sim_host.ooms() == []
        held = sim_host.read().held_by(comfy.pid, 0)
        assert held == CONTEXT + sum(comfy.vram.loaded.values())
        assert comfy.vram.loaded[unet] < 11350 * MiB

        sim_host.release(os.getpid(), ollama)
        prompt_id = await queue(session, comfy.url, flux(steps=3), client_id="me")
        events = await socket.until_done(prompt_id)
        assert "execution_success" in kinds(events)
        held = sim_host.read().held_by(comfy.pid, 0)
        assert held == CONTEXT + (11350 + 320) * MiB  # with room, the UNet loads whole
    finally:
        sim_host.release(os.getpid())
