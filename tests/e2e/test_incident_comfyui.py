"""The incident of 2026-07-10, through the CLI: a FLUX render on a 16 GiB card that Ollama's
idle 24 h holds, whisper and mVoice had filled.

`gpugate sim run` starts the incident host (its file copied, on free ports, without the
preloads: the test loads the models itself); clients speak only to public ports. Straight
at ComfyUI the render runs with only part of its UNet on the card (ComfyUI's partial load,
the rest streamed from CPU RAM at every step); through `gpugate serve` the same render
loads whole with no manual step: the gate evicts the idle
Ollama models for it, and its events say what went, for whom, and the bytes before and
after.

Also through the gate, compared with ComfyUI straight: a websocket client's event
sequence, a 20 MiB upload, and `/view` with a Range header.
"""

from __future__ import annotations

import asyncio
import json
import re
import textwrap
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.clihost import running_gate, running_host
from tests.ports import free_ports
from tests.sim.comfyui_helpers import blank, flux

pytestmark = pytest.mark.e2e

INCIDENT = Path(__file__).resolve().parents[2] / "gpugate_sim/data/incident-2026-07-10.yaml"
MiB = 1 << 20


def host_yaml(ollama: int, whisper: int, comfy: int) -> str:
    text = INCIDENT.read_text()
    text = text.replace("127.0.0.1:11435", f"127.0.0.1:{ollama}")
    text = text.replace("127.0.0.1:8081", f"127.0.0.1:{whisper}")
    text = text.replace("127.0.0.1:8189", f"127.0.0.1:{comfy}")
    # The models are loaded by the test, as the incident's batch job did.
    text = re.sub(r"\n  preload:\n(    .*\n)+", "\n", text)
    assert "\n  preload:" not in text
    return text


def consumers_yaml(control: int, ollama: tuple[int, int], comfy: tuple[int, int]) -> str:
    return textwrap.dedent(f"""\
        gate:
          control: 127.0.0.1:{control}
          shutdown_grace: 2s
        budget:
          reserve: 1GiB
          reserve_max: 1GiB
          sample_interval: 100ms
          reclaim_timeout: 10s
        consumers:
          ollama:
            runtime: ollama
            listen: 127.0.0.1:{ollama[0]}
            upstream: http://127.0.0.1:{ollama[1]}
            class: interactive
            residency: {{policy: keep_warm, ttl: 15m}}
            processes: {{commands: ["ollama serve"]}}
            models:
              gemma3:12b: {{class: background}}
              bge-m3: {{class: background}}
          comfyui:
            runtime: comfyui
            listen: 127.0.0.1:{comfy[0]}
            upstream: http://127.0.0.1:{comfy[1]}
            class: interactive
            residency: {{policy: keep_warm, ttl: 15m}}
            processes: {{commands: ["ComfyUI/main.py"]}}
            working_set: 0
            working_set_per_megapixel: 1GiB
            files:
              v1-5-pruned-emaonly-fp16.safetensors: 2034MiB
              flux1-dev-fp8.safetensors: 11350MiB
              t5xxl_fp8_e4m3fn.safetensors: 4667MiB
              clip_l.safetensors: 235MiB
              ae.safetensors: 320MiB
        external:
          whisper:
            processes: {{commands: ["whisper-server"]}}
          mvoice:
            processes: {{commands: ["mvoice_server.py"]}}
        """)


class Socket:
    """A websocket client of ComfyUI's /ws: text events in order."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self.ws = ws

    async def event(self) -> dict[str, Any]:
        while True:
            msg = await self.ws.receive(timeout=60)
            if msg.type is aiohttp.WSMsgType.BINARY:
                continue
            assert msg.type is aiohttp.WSMsgType.TEXT, msg
            return json.loads(msg.data)

    async def run(self, session: aiohttp.ClientSession, url: str, graph: dict, client: str):
        """Queue `graph` for this socket's client; its events up to `executing null`."""
        async with session.post(
            f"{url}/prompt", json={"prompt": graph, "client_id": client}
        ) as resp:
            assert resp.status == 200, await resp.text()
            prompt_id = (await resp.json())["prompt_id"]
        events = []
        while True:
            event = await self.event()
            events.append(event)
            data = event["data"]
            node_null = event["type"] == "executing" and data.get("node") is None
            if node_null and data.get("prompt_id") == prompt_id:
                return prompt_id, events


async def connect(session: aiohttp.ClientSession, url: str, client: str) -> Socket:
    socket = Socket(await session.ws_connect(f"{url}/ws?clientId={client}"))
    first = await socket.event()
    assert first["type"] == "status" and first["data"]["sid"] == client
    return socket


def outcome(events: list[dict[str, Any]]) -> dict[str, Any]:
    [end] = [e for e in events if e["type"] in ("execution_success", "execution_error")]
    return end


def normalised(events: list[dict[str, Any]], prompt_id: str) -> list[tuple[str, str]]:
    """Event types and their data with the prompt's id, timestamps and file names out."""
    out = []
    for event in events:
        data = {k: v for k, v in event["data"].items() if k != "timestamp"}
        if event["type"] == "status":
            data.pop("sid", None)
        if event["type"] == "executed":
            for image in data.get("output", {}).get("images", []):
                image.pop("filename", None)
        text = json.dumps(data, sort_keys=True).replace(prompt_id, "P")
        out.append((event["type"], text))
    return out


@pytest.fixture
def incident(tmp_path):
    ports = free_ports(6)
    ollama, whisper, comfy, gate_ollama, gate_comfy, control = ports
    host_file = tmp_path / "incident.yaml"
    host_file.write_text(host_yaml(ollama, whisper, comfy))
    config = tmp_path / "consumers.yaml"
    config.write_text(consumers_yaml(control, (gate_ollama, ollama), (gate_comfy, comfy)))
    with running_host(host_file, tmp_path / "state", ollama) as host:
        yield host, config, (ollama, comfy, gate_ollama, gate_comfy, control)


async def load(session: aiohttp.ClientSession, url: str) -> None:
    """gemma3:12b for 24 h and bge-m3, as the incident's batch job loaded them."""
    for route, body in (
        ("/api/generate", {"model": "gemma3:12b", "prompt": "x", "keep_alive": "24h"}),
        ("/api/embed", {"model": "bge-m3", "input": "x", "keep_alive": "24h"}),
    ):
        async with session.post(url + route, json={**body, "stream": False}) as resp:
            assert resp.status == 200, await resp.text()


async def partly_loaded_then_freed(session: aiohttp.ClientSession, url: str) -> None:
    """After a render straight at ComfyUI: less than the UNet's 11,350 MiB was on the card
    (a partial load); then `/free` empties it, as the OOM's unload used to."""

    async def torch_vram() -> int:
        async with session.get(url + "/system_stats") as resp:
            return int((await resp.json())["devices"][0]["torch_vram_total"])

    assert 0 < await torch_vram() < 11350 * MiB
    async with session.post(url + "/free", json={"unload_models": True, "free_memory": True}):
        pass
    async with asyncio.timeout(20):
        while await torch_vram() > 0:  # the worker frees once idle: poll its own report
            await asyncio.sleep(0.05)


async def test_flux_renders_whole_through_the_gate_where_it_loaded_partly_directly(incident):
    host, config, (ollama, comfy, gate_ollama, gate_comfy, control) = incident
    direct_comfy = f"http://127.0.0.1:{comfy}"
    async with aiohttp.ClientSession() as session:
        # Before the gate: the incident, straight at the runtimes. ComfyUI renders, slowly,
        # with what fits of the UNet beside its working set and reserve.
        await load(session, f"http://127.0.0.1:{ollama}")
        socket = await connect(session, direct_comfy, "before")
        _, events = await socket.run(session, direct_comfy, flux(), "before")
        assert outcome(events)["type"] == "execution_success", outcome(events)
        await socket.ws.close()
        await partly_loaded_then_freed(session, direct_comfy)

        with running_gate(config, host.env(), gate_ollama, control) as gate:
            # The batch job again, now through the gate's Ollama port.
            await load(session, f"http://127.0.0.1:{gate_ollama}")
            url = f"http://127.0.0.1:{gate_comfy}"
            socket = await connect(session, url, "after")
            _, events = await socket.run(session, url, flux(), "after")
            assert outcome(events)["type"] == "execution_success", outcome(events)
            await socket.ws.close()

            status = await until_no_lease(gate)
            log = await gate.events()
    started = [e for e in log if e["event"] == "eviction_started"]
    done = [e for e in log if e["event"] == "eviction_done"]
    assert {e["model"] for e in started} == {"gemma3:12b", "bge-m3:latest"}
    assert {e["model"] for e in done} == {"gemma3:12b", "bge-m3:latest"}
    # For whom, and the bytes: each victim's, and the job's lease they made room for.
    for event in started:
        assert event["consumer"] == "ollama" and event["bytes"] > 1500 * MiB
        assert event["detail"].startswith("for comfyui/job-")
    [queued] = [e for e in log if e["event"] == "ticket_queued" and e["consumer"] == "comfyui"]
    assert queued["bytes"] == (11350 + 1024) * MiB
    # What their runners hold (their shapes in the host file): 8,330 and 1,617 MiB.
    assert sum(e["bytes"] for e in done) >= (8329 + 1617) * MiB
    # The bytes before and after: the job did not fit before, it fits once the last is done.
    for event in started:
        assert event["schedulable_before"] < queued["bytes"]
        before = event["schedulable_before"] / 2**30
        assert event["detail"].endswith(f"; {before:.1f} GiB schedulable before")
    assert len({e["schedulable_before"] for e in started}) == 1
    for event in done:
        after = event["schedulable_after"] / 2**30
        assert event["detail"] == f"reclaimed; {after:.1f} GiB schedulable after"
    afters = [e["schedulable_after"] for e in done]
    assert afters == sorted(afters)
    assert afters[-1] >= queued["bytes"]
    # Each victim's bytes came back to the schedulable pool, less NVML's own slack.
    freed = afters[-1] - started[0]["schedulable_before"]
    assert freed >= 0.9 * sum(e["bytes"] for e in started), (freed, started, done)
    assert status["leases"] == [] and status.get("waiting", []) == []
    assert {r["model"] for r in status["residents"] if r["consumer"] == "comfyui"} == {"<held>"}


async def until_no_lease(gate, timeout: float = 10.0) -> dict[str, Any]:
    """The gate's status once its job loop saw the job end (it polls ComfyUI twice a second)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        status = await gate.status()
        if not status["leases"] or loop.time() > deadline:
            return status
        await asyncio.sleep(0.1)


async def test_sockets_uploads_and_ranges_are_the_same_through_the_gate(incident, tmp_path):
    host, config, (_, comfy, gate_ollama, gate_comfy, control) = incident
    direct = f"http://127.0.0.1:{comfy}"
    through = f"http://127.0.0.1:{gate_comfy}"
    payload = bytes(range(256)) * (20 * MiB // 256)
    with running_gate(config, host.env(), gate_ollama, control):
        async with aiohttp.ClientSession() as session:
            sequences = []
            # Two graphs alike but for their width: neither run is served from ComfyUI's cache.
            for url, client, width in ((direct, "d1", 32), (through, "g1", 48)):
                socket = await connect(session, url, client)
                prompt_id, events = await socket.run(session, url, blank(width), client)
                sequences.append(normalised(events, prompt_id))
                await socket.ws.close()
            assert sequences[0] == sequences[1]

            names = []
            for url, name in ((through, "through.bin"), (direct, "direct.bin")):
                form = aiohttp.FormData()
                form.add_field("image", payload, filename=name, content_type="image/png")
                form.add_field("overwrite", "true")
                async with session.post(f"{url}/upload/image", data=form) as resp:
                    assert resp.status == 200, await resp.text()
                    names.append((await resp.json())["name"])
            assert names == ["through.bin", "direct.bin"]

            answers = []
            for url in (through, direct):
                async with session.get(
                    f"{url}/view",
                    params={"filename": "through.bin", "type": "input"},
                    headers={"Range": "bytes=1000-1999"},
                ) as resp:
                    answers.append(
                        (resp.status, resp.headers.get("Content-Range"), await resp.read())
                    )
            assert answers[0] == answers[1]
            assert answers[0][0] == 206 and answers[0][2] == payload[1000:2000]
