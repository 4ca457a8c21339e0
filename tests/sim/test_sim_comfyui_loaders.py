"""Loader nodes of the simulated ComfyUI running as 0.3.64's do: VAELoader's extra names,
UpscaleModelLoader's unchecked combo, LoraLoader at zero strength."""

from __future__ import annotations

from typing import Any

import aiohttp

from gpugate.core.units import MiB
from gpugate_sim.comfyui.memory import Part
from gpugate_sim.scenario import ComfyModelFile
from tests.sim.comfyui_helpers import (
    MODELS,
    SD15,
    connect,
    make_comfy,
    queue,
    session,
    txt2img,
)

__all__ = ["make_comfy", "session"]

TAESD = (
    ComfyModelFile("vae_approx", "taesd_encoder.pth", 5 * MiB),
    ComfyModelFile("vae_approx", "taesd_decoder.pth", 6 * MiB),
)
UPSCALER = ComfyModelFile("upscale_models", "4x-UltraSharp.pth", 64 * MiB)
LORA = ComfyModelFile("loras", "detail.safetensors", 144 * MiB)


def _with_vae(name: str) -> dict[str, Any]:
    graph = txt2img()
    graph["10"] = {"class_type": "VAELoader", "inputs": {"vae_name": name}}
    graph["8"]["inputs"]["vae"] = ["10", 0]
    return graph


def _upscaled(model_name: object) -> dict[str, Any]:
    graph = txt2img()
    graph["14"] = {"class_type": "UpscaleModelLoader", "inputs": {"model_name": model_name}}
    graph["15"] = {
        "class_type": "ImageUpscaleWithModel",
        "inputs": {"upscale_model": ["14", 0], "image": ["8", 0]},
    }
    graph["9"]["inputs"]["images"] = ["15", 0]
    return graph


def _with_lora(strength: float) -> dict[str, Any]:
    graph = txt2img()
    graph["10"] = {
        "class_type": "LoraLoader",
        "inputs": {"model": ["4", 0], "clip": ["4", 1], "lora_name": LORA.name,
                   "strength_model": strength, "strength_clip": strength},
    }  # fmt: skip
    graph["3"]["inputs"]["model"] = ["10", 0]
    graph["6"]["inputs"]["clip"] = ["10", 1]
    graph["7"]["inputs"]["clip"] = ["10", 1]
    return graph


def _last(events: list[dict[str, Any]]) -> tuple[str, dict[str, Any]]:
    """The event that ended the prompt: execution_success or execution_error."""
    end = [e for e in events if e["type"] in ("execution_success", "execution_error")]
    return end[-1]["type"], end[-1]["data"]


async def test_vae_loader_offers_taesd_and_pixel_space(make_comfy, session: aiohttp.ClientSession):
    comfy = await make_comfy(models=(*MODELS, *TAESD))
    socket = await connect(session, comfy.url, "me")
    prompt_id = await queue(session, comfy.url, _with_vae("taesd"), client_id="me")
    assert _last(await socket.until_done(prompt_id))[0] == "execution_success"
    # One VAE made of the encoder and the decoder (VAELoader.load_taesd), on the GPU.
    taesd = Part("vae_approx", "taesd_encoder.pth+taesd_decoder.pth", "vae", 11 * MiB)
    assert taesd in comfy.vram.loaded
    assert not [p for p in comfy.vram.loaded if p.name == SD15 and p.role == "vae"]
    before = set(comfy.vram.loaded)
    prompt_id = await queue(session, comfy.url, _with_vae("pixel_space"), client_id="me")
    assert _last(await socket.until_done(prompt_id))[0] == "execution_success"
    assert {p for p in comfy.vram.loaded if p.role == "vae"} <= before, "no weights to load"
    # taesdxl needs both files in vae_approx: it is not in the list.
    async with session.post(f"{comfy.url}/prompt", json={"prompt": _with_vae("taesdxl")}) as r:
        body = await r.json()
    (reason,) = body["node_errors"]["10"]["errors"]
    assert (r.status, reason["type"], reason["details"]) == (
        400,
        "value_not_in_list",
        "vae_name: 'taesdxl' not in ['ae.safetensors', 'taesd', 'pixel_space']",
    )


async def test_upscale_model_name_is_left_to_the_loader(make_comfy, session: aiohttp.ClientSession):
    # A V3 io.Combo is declared as COMBO: 0.3.64's validation does not check its value.
    comfy = await make_comfy(models=(*MODELS, UPSCALER))
    socket = await connect(session, comfy.url, "me")
    prompt_id = await queue(session, comfy.url, _upscaled("missing.pth"), client_id="me")
    kind, data = _last(await socket.until_done(prompt_id))
    assert (kind, data["node_id"], data["exception_type"], data["exception_message"]) == (
        "execution_error",
        "14",
        "FileNotFoundError",
        "Model in folder 'upscale_models' with filename 'missing.pth' not found.\n",
    )
    # get_full_path normalizes the name before it looks: this one is the listed file.
    prompt_id = await queue(session, comfy.url, _upscaled("x/../4x-UltraSharp.pth"), client_id="me")
    assert _last(await socket.until_done(prompt_id))[0] == "execution_success"
    assert Part("upscale_models", UPSCALER.name, "upscale", UPSCALER.size) in comfy.vram.loaded


async def test_a_lora_at_zero_strength_is_never_loaded(make_comfy, session: aiohttp.ClientSession):
    comfy = await make_comfy(models=(*MODELS, LORA))
    socket = await connect(session, comfy.url, "me")
    lora = Part("loras", LORA.name, "lora", LORA.size)
    prompt_id = await queue(session, comfy.url, _with_lora(0.0), client_id="me")
    assert _last(await socket.until_done(prompt_id))[0] == "execution_success"
    assert lora not in comfy.vram.loaded
    prompt_id = await queue(session, comfy.url, _with_lora(0.5), client_id="me")
    assert _last(await socket.until_done(prompt_id))[0] == "execution_success"
    assert lora in comfy.vram.loaded
