"""The simulated ComfyUI's HTTP contract: validation, queue, history, files, origin check."""

from __future__ import annotations

import hashlib
import os

import aiohttp
import pytest

from gpugate_sim.comfyui import SimComfyUI
from tests.sim.comfyui_helpers import (
    SD15,
    blank,
    comfy,
    connect,
    make_comfy,
    queue,
    session,
    txt2img,
)

__all__ = ["comfy", "make_comfy", "session"]

CKPT_TOOLTIP = "The name of the checkpoint (model) to load."
"""nodes.py CheckpointLoaderSimple.INPUT_TYPES: echoed in the input_config of its errors."""


async def _post(session: aiohttp.ClientSession, url: str, body: object) -> tuple[int, dict]:
    async with session.post(f"{url}/prompt", json=body) as resp:
        assert resp.content_type == "application/json"
        return resp.status, await resp.json()


async def test_missing_prompt_is_no_prompt(comfy: SimComfyUI, session: aiohttp.ClientSession):
    status, body = await _post(session, comfy.url, {"client_id": "x"})
    assert status == 400
    assert body == {
        "error": {"type": "no_prompt", "message": "No prompt provided",
                  "details": "No prompt provided", "extra_info": {}},
        "node_errors": {},
    }  # fmt: skip


async def test_unknown_class_and_missing_class_type_are_invalid_prompt(
    comfy: SimComfyUI, session: aiohttp.ClientSession
):
    status, body = await _post(session, comfy.url, {"prompt": {"3": {"class_type": "Nope"}}})
    assert status == 400
    assert body == {
        "error": {"type": "invalid_prompt",
                  "message": "Cannot execute because node Nope does not exist.",
                  "details": "Node ID '#3'", "extra_info": {}},
        "node_errors": {},
    }  # fmt: skip
    status, body = await _post(session, comfy.url, {"prompt": {"3": {"inputs": {}}}})
    assert body["error"]["message"] == (
        "Cannot execute because a node is missing the class_type property."
    )


async def test_graph_without_output_node(comfy: SimComfyUI, session: aiohttp.ClientSession):
    prompt = {"1": blank()["1"]}
    status, body = await _post(session, comfy.url, {"prompt": prompt})
    assert status == 400
    assert body == {
        "error": {"type": "prompt_no_outputs", "message": "Prompt has no outputs", "details": "",
                  "extra_info": {}},
        "node_errors": {},
    }  # fmt: skip


async def test_unknown_model_file_is_value_not_in_list(
    comfy: SimComfyUI, session: aiohttp.ClientSession
):
    prompt = txt2img(ckpt="sdxl.safetensors")
    status, body = await _post(session, comfy.url, {"prompt": prompt})
    assert status == 400
    assert body["error"] == {
        "type": "prompt_outputs_failed_validation",
        "message": "Prompt outputs failed validation",
        # Upstream joins only the output node's own reasons; the loader's are in node_errors.
        "details": "",
        "extra_info": {},
    }
    assert body["node_errors"] == {
        "4": {
            "errors": [{
                "type": "value_not_in_list", "message": "Value not in list",
                "details": f"ckpt_name: 'sdxl.safetensors' not in ['{SD15}']",
                "extra_info": {"input_name": "ckpt_name",
                               "input_config": [[SD15], {"tooltip": CKPT_TOOLTIP}],
                               "received_value": "sdxl.safetensors"},
            }],
            "dependent_outputs": ["9"],
            "class_type": "CheckpointLoaderSimple",
        }
    }  # fmt: skip
    assert comfy.queue.tasks_remaining() == 0


async def test_missing_input_bounds_and_bad_links(
    comfy: SimComfyUI, session: aiohttp.ClientSession
):
    prompt = txt2img()
    del prompt["6"]["inputs"]["text"]
    prompt["5"]["inputs"]["width"] = 8
    prompt["3"]["inputs"]["steps"] = 20000
    status, body = await _post(session, comfy.url, {"prompt": prompt})
    assert status == 400
    errors = {node: [e["type"] for e in v["errors"]] for node, v in body["node_errors"].items()}
    assert errors == {
        "6": ["required_input_missing"],
        "5": ["value_smaller_than_min"],
        "3": ["value_bigger_than_max"],
    }
    assert body["node_errors"]["5"]["errors"][0]["message"] == "Value 8 smaller than min of 16"
    assert body["node_errors"]["3"]["errors"][0]["details"] == "steps"
    # A link to a node that does not exist raises inside validation, as upstream.
    prompt = blank()
    prompt["2"]["inputs"]["images"] = ["99", 0]
    status, body = await _post(session, comfy.url, {"prompt": prompt})
    reason = body["node_errors"]["2"]["errors"][0]
    assert (status, reason["type"], reason["details"]) == (
        400, "exception_during_validation", "'99'",
    )  # fmt: skip
    assert reason["extra_info"]["exception_type"] == "KeyError"


@pytest.mark.parametrize(
    ("path", "body"),
    [("/prompt", b"{not json"), ("/prompt", b'{"prompt": [1, 2]}'), ("/free", b""),
     ("/api/queue", b"[")],
)  # fmt: skip
async def test_malformed_bodies_are_500_text_and_close(
    comfy: SimComfyUI, session: aiohttp.ClientSession, path: str, body: bytes
):
    async with session.post(comfy.url + path, data=body) as resp:
        assert resp.status == 500
        assert resp.content_type == "text/plain"
        assert resp.headers["Connection"] == "close"


async def test_client_prompt_id_number_and_front_order_the_queue(
    make_comfy, session: aiohttp.ClientSession
):
    comfy = await make_comfy(node_seconds=0.3)
    socket = await connect(session, comfy.url, "me")
    first = await queue(session, comfy.url, blank(), client_id="me", prompt_id="first")
    assert first == "first"
    await socket.until("execution_start")
    async with session.post(f"{comfy.url}/prompt", json={"prompt": blank(40)}) as resp:
        assert (await resp.json())["number"] == 1
    async with session.post(f"{comfy.url}/api/prompt",
                            json={"prompt": blank(48), "front": True}) as resp:  # fmt: skip
        body = await resp.json()
        assert body["number"] == -2
        front = body["prompt_id"]
    async with session.get(f"{comfy.url}/queue") as resp:
        listing = await resp.json()
    assert [item[1] for item in listing["queue_running"]] == ["first"]
    assert listing["queue_running"][0][3] == {"client_id": "me"}
    assert listing["queue_pending"][0][1] == front
    async with session.get(f"{comfy.url}/prompt") as resp:
        assert await resp.json() == {"exec_info": {"queue_remaining": 3}}


async def test_queue_delete_and_clear_pending_only(make_comfy, session: aiohttp.ClientSession):
    comfy = await make_comfy(node_seconds=0.3)
    watcher = await connect(session, comfy.url)
    socket = await connect(session, comfy.url, "me")
    running = await queue(session, comfy.url, blank(), client_id="me")
    await socket.until("execution_start")
    doomed = await queue(session, comfy.url, blank(40))
    kept = await queue(session, comfy.url, blank(48))
    async with session.post(f"{comfy.url}/queue", json={"delete": [doomed, running]}) as resp:
        assert resp.status == 200 and await resp.read() == b""
    async with session.get(f"{comfy.url}/queue") as resp:
        listing = await resp.json()
    assert [i[1] for i in listing["queue_pending"]] == [kept]
    assert [i[1] for i in listing["queue_running"]] == [running]
    async with session.post(f"{comfy.url}/queue", json={"clear": True}):
        pass
    await socket.until_done(running)
    # Every change was broadcast as `status`, to a socket that submitted nothing too.
    remaining = []
    while not remaining or remaining[-1] != 0:
        event = await watcher.event()
        assert event["type"] == "status"
        remaining.append(event["data"]["status"]["exec_info"]["queue_remaining"])
    assert remaining == [1, 1, 2, 3, 2, 1, 0]
    async with session.get(f"{comfy.url}/history/{doomed}") as resp:
        assert await resp.json() == {}
    async with session.get(f"{comfy.url}/history") as resp:
        assert list(await resp.json()) == [running]


async def test_history_entry_view_and_range(comfy: SimComfyUI, session: aiohttp.ClientSession):
    socket = await connect(session, comfy.url, "me")
    prompt_id = await queue(session, comfy.url, blank(), client_id="me")
    await socket.until_done(prompt_id)
    async with session.get(f"{comfy.url}/api/history/{prompt_id}") as resp:
        entry = (await resp.json())[prompt_id]
    image = {"filename": "blank_00001_.png", "subfolder": "", "type": "output"}
    assert entry["outputs"] == {"2": {"images": [image]}}
    assert entry["status"]["status_str"] == "success" and entry["status"]["completed"] is True
    assert [m[0] for m in entry["status"]["messages"]] == [
        "execution_start", "execution_cached", "execution_success",
    ]  # fmt: skip
    assert entry["prompt"][:2] == [0, prompt_id] and entry["prompt"][4] == ["2"]
    data = (comfy.output_dir / "blank_00001_.png").read_bytes()
    async with session.get(f"{comfy.url}/view", params=image) as resp:
        assert resp.status == 200 and resp.content_type == "image/png"
        assert resp.headers["Content-Disposition"] == 'filename="blank_00001_.png"'
        assert await resp.read() == data
    async with session.get(f"{comfy.url}/view", params=image,
                           headers={"Range": "bytes=0-7"}) as resp:  # fmt: skip
        assert resp.status == 206
        assert await resp.read() == b"\x89PNG\r\n\x1a\n"
    assert (await session.get(f"{comfy.url}/view", params={"filename": "../x"})).status == 400
    assert (await session.get(f"{comfy.url}/view", params={"filename": "nope.png"})).status == 404
    params = {"filename": "blank_00001_.png", "subfolder": "../../"}
    assert (await session.get(f"{comfy.url}/view", params=params)).status == 403
    async with session.post(f"{comfy.url}/history", json={"delete": [prompt_id]}):
        pass
    async with session.get(f"{comfy.url}/history/{prompt_id}") as resp:
        assert await resp.json() == {}


async def test_upload_of_20_mib_is_streamed_to_disk(
    comfy: SimComfyUI, session: aiohttp.ClientSession
):
    payload = os.urandom(20 * 1024 * 1024)
    for expected in ("photo.png", "photo (1).png"):
        form = aiohttp.FormData()
        form.add_field("image", payload if expected == "photo.png" else payload[::-1],
                       filename="photo.png", content_type="image/png")  # fmt: skip
        async with session.post(f"{comfy.url}/upload/image", data=form) as resp:
            assert resp.status == 200
            assert await resp.json() == {"name": expected, "subfolder": "", "type": "input"}
    stored = (comfy.input_dir / "photo.png").read_bytes()
    assert hashlib.sha256(stored).digest() == hashlib.sha256(payload).digest()
    # The same bytes again are recognised as a duplicate, not stored a third time.
    form = aiohttp.FormData()
    form.add_field("image", payload, filename="photo.png", content_type="image/png")
    async with session.post(f"{comfy.url}/upload/image", data=form) as resp:
        assert await resp.json() == {"name": "photo.png", "subfolder": "", "type": "input"}
    assert sorted(p.name for p in comfy.input_dir.iterdir()) == ["photo (1).png", "photo.png"]


async def test_models_system_stats_root_and_unknown(
    comfy: SimComfyUI, session: aiohttp.ClientSession
):
    async with session.get(f"{comfy.url}/api/models/text_encoders") as resp:
        assert await resp.json() == ["clip_l.safetensors", "t5xxl_fp8_e4m3fn.safetensors"]
    async with session.get(f"{comfy.url}/models") as resp:
        assert "diffusion_models" in await resp.json()
    assert (await session.get(f"{comfy.url}/models/unet")).status == 404
    async with session.get(f"{comfy.url}/system_stats") as resp:
        device = (await resp.json())["devices"][0]
    assert device["vram_total"] == comfy.gpu.read().device(0).total
    assert device["vram_free"] == comfy.gpu.free(0)
    async with session.get(f"{comfy.url}/") as resp:
        assert resp.content_type == "text/html" and resp.headers["Cache-Control"] == "no-cache"
        assert "new WebSocket" in await resp.text()
    for path in ("/nope", "/api/nope"):
        async with session.get(comfy.url + path) as resp:
            assert resp.status == 404 and await resp.read() == b""


@pytest.mark.parametrize(
    ("host", "origin", "status"),
    [
        ("127.0.0.1:{port}", "http://127.0.0.1:{port}", 200),
        ("127.0.0.1:{port}", "http://localhost:{port}", 403),
        ("localhost:{port}", "http://127.0.0.1:{port}", 403),
        ("127.0.0.1:{port}", "https://127.0.0.1", 200),
        ("127.0.0.1", "http://127.0.0.1:9999", 200),
        ("127.0.0.1:{port}", "http://evil.example:{port}", 403),
        ("127.0.0.1:{port}", "null", 200),
        ("gpu-host.example:8080", "http://elsewhere.example", 200),
    ],
)
async def test_origin_check(
    comfy: SimComfyUI, session: aiohttp.ClientSession, host: str, origin: str, status: int
):
    port = comfy.url.rsplit(":", 1)[1]
    headers = {"Host": host.format(port=port), "Origin": origin.format(port=port)}
    for method, path in (("GET", "/"), ("OPTIONS", "/prompt"), ("GET", "/api/prompt")):
        async with session.request(method, comfy.url + path, headers=headers) as resp:
            assert resp.status == status, (method, path)
            if status == 403:
                assert await resp.read() == b""
    if status == 403:
        with pytest.raises(aiohttp.WSServerHandshakeError) as err:
            await session.ws_connect(f"{comfy.url}/ws", headers=headers)
        assert err.value.status == 403


async def test_enable_cors_header_replaces_the_check(make_comfy, session: aiohttp.ClientSession):
    comfy = await make_comfy(enable_cors_header="*")
    headers = {"Origin": "http://evil.example"}
    async with session.get(f"{comfy.url}/prompt", headers=headers) as resp:
        assert resp.status == 200
        assert resp.headers["Access-Control-Allow-Origin"] == "*"
    async with session.options(f"{comfy.url}/prompt", headers=headers) as resp:
        assert resp.status == 200
        assert resp.headers["Access-Control-Allow-Methods"] == "POST, GET, DELETE, PUT, OPTIONS"
