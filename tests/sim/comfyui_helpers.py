"""Shared pieces of the simulated ComfyUI tests: graphs, a started server, a socket reader."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import pytest

from gpugate.core.units import GiB, MiB
from gpugate_sim.comfyui import SimComfyUI
from gpugate_sim.device import SimulatedGpuHost
from gpugate_sim.scenario import ComfyModelFile, ComfyUISpec

SD15 = "v1-5-pruned-emaonly-fp16.safetensors"
MODELS = (
    ComfyModelFile("checkpoints", SD15, 2034 * MiB),
    ComfyModelFile("diffusion_models", "flux1-dev-fp8.safetensors", 11350 * MiB),
    ComfyModelFile("text_encoders", "t5xxl_fp8_e4m3fn.safetensors", 4667 * MiB),
    ComfyModelFile("text_encoders", "clip_l.safetensors", 235 * MiB),
    ComfyModelFile("vae", "ae.safetensors", 320 * MiB),
)
MakeComfy = Callable[..., Awaitable[SimComfyUI]]


def txt2img(seed: int = 1, steps: int = 3, ckpt: str = SD15, size: int = 512) -> dict[str, Any]:
    """The stock text-to-image workflow in API format."""
    return {
        "4": {"class_type": "CheckpointLoaderSimple", "inputs": {"ckpt_name": ckpt}},
        "6": {"class_type": "CLIPTextEncode", "inputs": {"text": "a cat", "clip": ["4", 1]}},
        "7": {"class_type": "CLIPTextEncode", "inputs": {"text": "", "clip": ["4", 1]}},
        "5": {"class_type": "EmptyLatentImage",
              "inputs": {"width": size, "height": size, "batch_size": 1}},
        "3": {"class_type": "KSampler",
              "inputs": {"model": ["4", 0], "seed": seed, "steps": steps, "cfg": 8.0,
                         "sampler_name": "euler", "scheduler": "normal", "positive": ["6", 0],
                         "negative": ["7", 0], "latent_image": ["5", 0], "denoise": 1.0}},
        "8": {"class_type": "VAEDecode", "inputs": {"samples": ["3", 0], "vae": ["4", 2]}},
        "9": {"class_type": "SaveImage",
              "inputs": {"images": ["8", 0], "filename_prefix": "ComfyUI"}},
    }  # fmt: skip


def flux(steps: int = 2) -> dict[str, Any]:
    """FLUX.1-dev with separate UNet, text encoder and VAE loaders, 1024x1024."""
    return {
        "1": {"class_type": "UNETLoader",
              "inputs": {"unet_name": "flux1-dev-fp8.safetensors", "weight_dtype": "default"}},
        "2": {"class_type": "DualCLIPLoader",
              "inputs": {"clip_name1": "t5xxl_fp8_e4m3fn.safetensors",
                         "clip_name2": "clip_l.safetensors", "type": "flux"}},
        "3": {"class_type": "VAELoader", "inputs": {"vae_name": "ae.safetensors"}},
        "4": {"class_type": "CLIPTextEncode", "inputs": {"text": "a fox", "clip": ["2", 0]}},
        "5": {"class_type": "FluxGuidance", "inputs": {"conditioning": ["4", 0], "guidance": 3.5}},
        "6": {"class_type": "EmptyLatentImage",
              "inputs": {"width": 1024, "height": 1024, "batch_size": 1}},
        "7": {"class_type": "KSampler",
              "inputs": {"model": ["1", 0], "seed": 7, "steps": steps, "cfg": 1.0,
                         "sampler_name": "euler", "scheduler": "simple", "positive": ["5", 0],
                         "negative": ["5", 0], "latent_image": ["6", 0], "denoise": 1.0}},
        "8": {"class_type": "VAEDecode", "inputs": {"samples": ["7", 0], "vae": ["3", 0]}},
        "9": {"class_type": "SaveImage", "inputs": {"images": ["8", 0], "filename_prefix": "flux"}},
    }  # fmt: skip


def blank(width: int = 32) -> dict[str, Any]:
    """A model-free graph: EmptyImage -> SaveImage."""
    return {
        "1": {"class_type": "EmptyImage",
              "inputs": {"width": width, "height": 16, "batch_size": 1, "color": 0xFF8800}},
        "2": {"class_type": "SaveImage",
              "inputs": {"images": ["1", 0], "filename_prefix": "blank"}},
    }  # fmt: skip


@pytest.fixture
async def make_comfy(sim_host: SimulatedGpuHost) -> AsyncIterator[MakeComfy]:
    """Start SimComfyUI servers on free ports; on teardown, check their VRAM is back."""
    started: list[SimComfyUI] = []

    async def make(**fields: Any) -> SimComfyUI:
        fields.setdefault("models", MODELS)
        fields.setdefault("steps_per_second", 500.0)
        sim = SimComfyUI(ComfyUISpec(**fields), sim_host)
        await sim.start("127.0.0.1", 0)
        started.append(sim)
        return sim

    yield make
    for sim in started:
        await sim.close()
    assert sim_host.read().processes == []


@pytest.fixture
async def comfy(make_comfy: MakeComfy) -> SimComfyUI:
    return await make_comfy()


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as http:
        yield http


class Socket:
    """One /ws connection; reads events in order."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self.ws = ws
        self.binary: list[bytes] = []

    async def event(self) -> dict[str, Any]:
        """The next text event (binary frames are kept in `binary`)."""
        while True:
            msg = await self.ws.receive(timeout=10)
            if msg.type == aiohttp.WSMsgType.BINARY:
                self.binary.append(msg.data)
                continue
            assert msg.type == aiohttp.WSMsgType.TEXT, msg
            return json.loads(msg.data)

    async def until_done(self, prompt_id: str) -> list[dict[str, Any]]:
        """Events up to and including `executing {node: null}` for `prompt_id`."""
        events = []
        while True:
            event = await self.event()
            events.append(event)
            data = event["data"]
            done = event["type"] == "executing" and data["node"] is None
            if done and data["prompt_id"] == prompt_id:
                return events

    async def nothing_pending(self) -> bool:
        """True if the server sent nothing before answering a ping now (needs autoping off)."""
        await self.ws.ping(b"marker")
        msg = await self.ws.receive(timeout=10)
        return msg.type == aiohttp.WSMsgType.PONG

    async def until(self, kind: str) -> dict[str, Any]:
        while (event := await self.event())["type"] != kind:
            pass
        return event


async def connect(
    session: aiohttp.ClientSession, url: str, client_id: str = "", *, autoping: bool = True
) -> Socket:
    query = f"?clientId={client_id}" if client_id else ""
    socket = Socket(await session.ws_connect(f"{url}/ws{query}", autoping=autoping))
    first = await socket.event()
    assert first["type"] == "status"
    return socket


async def queue(session: aiohttp.ClientSession, url: str, prompt: dict[str, Any],
                **body: Any) -> str:  # fmt: skip
    async with session.post(f"{url}/prompt", json={"prompt": prompt, **body}) as resp:
        assert resp.status == 200, await resp.text()
        return (await resp.json())["prompt_id"]


def kinds(events: list[dict[str, Any]]) -> list[str]:
    return [e["type"] for e in events]


GIB = GiB
