"""API-format graphs beyond the simulated ComfyUI's stock ones (tests.sim.comfyui_helpers):
LoRA, ControlNet and upscale workflows, each one the simulated ComfyUI accepts."""

from __future__ import annotations

import json
from typing import Any

from tests.sim.comfyui_helpers import SD15, blank, flux, txt2img

__all__ = ["SD15", "blank", "controlnet", "flux", "lora", "txt2img", "upscale"]

LORA = "detail-tweaker.safetensors"
CONTROLNET = "control_v11p_sd15_canny.safetensors"
UPSCALER = "4x-UltraSharp.pth"
FILES = {
    "checkpoints": [SD15],
    "diffusion_models": ["flux1-dev-fp8.safetensors"],
    "text_encoders": ["t5xxl_fp8_e4m3fn.safetensors", "clip_l.safetensors"],
    "vae": ["ae.safetensors"],
    "loras": [LORA, "style.safetensors"],
    "controlnet": [CONTROLNET],
    "upscale_models": [UPSCALER],
}
"""The model folders' listings the graphs below validate against."""


def lora(name: str = LORA) -> dict[str, Any]:
    """txt2img with a LoRA between the checkpoint and the sampler and text encoders."""
    graph = txt2img()
    graph["10"] = {
        "class_type": "LoraLoader",
        "inputs": {"model": ["4", 0], "clip": ["4", 1], "lora_name": name,
                   "strength_model": 0.8, "strength_clip": 0.8},
    }  # fmt: skip
    graph["3"]["inputs"]["model"] = ["10", 0]
    graph["6"]["inputs"]["clip"] = ["10", 1]
    graph["7"]["inputs"]["clip"] = ["10", 1]
    return graph


def controlnet() -> dict[str, Any]:
    """txt2img whose positive conditioning goes through a ControlNet on a blank image."""
    graph = txt2img()
    graph["11"] = {"class_type": "ControlNetLoader", "inputs": {"control_net_name": CONTROLNET}}
    graph["12"] = {
        "class_type": "EmptyImage",
        "inputs": {"width": 512, "height": 512, "batch_size": 1, "color": 0},
    }
    graph["13"] = {
        "class_type": "ControlNetApply",
        "inputs": {"conditioning": ["6", 0], "control_net": ["11", 0], "image": ["12", 0],
                   "strength": 1.0},
    }  # fmt: skip
    graph["3"]["inputs"]["positive"] = ["13", 0]
    return graph


def upscale() -> dict[str, Any]:
    """txt2img whose decoded image is upscaled with a model before it is saved."""
    graph = txt2img()
    graph["14"] = {"class_type": "UpscaleModelLoader", "inputs": {"model_name": UPSCALER}}
    graph["15"] = {
        "class_type": "ImageUpscaleWithModel",
        "inputs": {"upscale_model": ["14", 0], "image": ["8", 0]},
    }
    graph["9"]["inputs"]["images"] = ["15", 0]
    return graph


def body(graph: object, **fields: object) -> bytes:
    """A `POST /prompt` body for `graph`, with more top-level fields."""
    return json.dumps({"prompt": graph, **fields}).encode()
