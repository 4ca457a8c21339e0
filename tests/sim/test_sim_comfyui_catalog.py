"""The simulated ComfyUI's node catalog: `GET /object_info` as ComfyUI 0.3.64 serves it, and
validation by those same definitions.

The expected entries are written here from ComfyUI 0.3.64's source (nodes.py INPUT_TYPES
and class attributes, comfy/samplers.py, comfy_extras' io.Schema through `get_v1_info`),
not from the simulator's tables.
"""

from __future__ import annotations

import json
from typing import Any

import aiohttp
import attrs

from gpugate.core.units import MiB
from gpugate.runtimes.comfyui.catalog import InputKind, parse_object_info
from gpugate.sim.comfyui import SimComfyUI
from gpugate.sim.scenario import ComfyModelFile
from tests.sim.comfyui_helpers import (
    MODELS,
    SD15,
    comfy,
    connect,
    flux,
    make_comfy,
    queue,
    session,
    txt2img,
)

__all__ = ["comfy", "make_comfy", "session"]

# comfy/samplers.py: KSampler.SAMPLERS = KSAMPLER_NAMES + ["ddim", "uni_pc", "uni_pc_bh2"].
SAMPLERS_0_3_64 = [
    "euler", "euler_cfg_pp", "euler_ancestral", "euler_ancestral_cfg_pp", "heun", "heunpp2",
    "dpm_2", "dpm_2_ancestral", "lms", "dpm_fast", "dpm_adaptive", "dpmpp_2s_ancestral",
    "dpmpp_2s_ancestral_cfg_pp", "dpmpp_sde", "dpmpp_sde_gpu", "dpmpp_2m", "dpmpp_2m_cfg_pp",
    "dpmpp_2m_sde", "dpmpp_2m_sde_gpu", "dpmpp_2m_sde_heun", "dpmpp_2m_sde_heun_gpu",
    "dpmpp_3m_sde", "dpmpp_3m_sde_gpu", "ddpm", "lcm", "ipndm", "ipndm_v", "deis",
    "res_multistep", "res_multistep_cfg_pp", "res_multistep_ancestral",
    "res_multistep_ancestral_cfg_pp", "gradient_estimation", "gradient_estimation_cfg_pp",
    "er_sde", "seeds_2", "seeds_3", "sa_solver", "sa_solver_pece", "ddim", "uni_pc",
    "uni_pc_bh2",
]  # fmt: skip
# comfy/samplers.py: KSampler.SCHEDULERS = list(SCHEDULER_HANDLERS).
SCHEDULERS_0_3_64 = [
    "simple", "sgm_uniform", "karras", "exponential", "ddim_uniform", "beta", "normal",
    "linear_quadratic", "kl_optimal",
]  # fmt: skip
TAESD_FILES = (
    ComfyModelFile("vae_approx", "taesd_decoder.pth", 5 * MiB),
    ComfyModelFile("vae_approx", "taesd_encoder.pth", 5 * MiB),
    ComfyModelFile("vae_approx", "taesdxl_decoder.pth", 5 * MiB),  # no encoder: not offered
)
UPSCALER = ComfyModelFile("upscale_models", "4x-UltraSharp.pth", 64 * MiB)


def _v1(name: str, inputs: dict[str, Any], output: list[str], **rest: Any) -> dict[str, Any]:
    """server.py node_info for a nodes.py class, in its key order."""
    info = {
        "input": inputs,
        "input_order": {k: list(v) for k, v in inputs.items()},
        "output": output,
        "output_is_list": [False] * len(output),
        "output_name": output,
        "name": name,
    }
    return {**info, **rest}


KSAMPLER = _v1("KSampler", {"required": {
    "model": ["MODEL", {"tooltip": "The model used for denoising the input latent."}],
    "seed": ["INT", {"default": 0, "min": 0, "max": 0xFFFFFFFFFFFFFFFF,
                     "control_after_generate": True,
                     "tooltip": "The random seed used for creating the noise."}],
    "steps": ["INT", {"default": 20, "min": 1, "max": 10000,
                      "tooltip": "The number of steps used in the denoising process."}],
    "cfg": ["FLOAT", {"default": 8.0, "min": 0.0, "max": 100.0, "step": 0.1, "round": 0.01,
                      "tooltip": "The Classifier-Free Guidance scale balances creativity and "
                      "adherence to the prompt. Higher values result in images more closely "
                      "matching the prompt however too high values will negatively impact "
                      "quality."}],
    "sampler_name": [SAMPLERS_0_3_64, {
        "tooltip": "The algorithm used when sampling, this can affect the quality, speed, and "
        "style of the generated output."}],
    "scheduler": [SCHEDULERS_0_3_64, {
        "tooltip": "The scheduler controls how noise is gradually removed to form the image."}],
    "positive": ["CONDITIONING", {"tooltip": "The conditioning describing the attributes you "
                                             "want to include in the image."}],
    "negative": ["CONDITIONING", {"tooltip": "The conditioning describing the attributes you "
                                             "want to exclude from the image."}],
    "latent_image": ["LATENT", {"tooltip": "The latent image to denoise."}],
    "denoise": ["FLOAT", {"default": 1.0, "min": 0.0, "max": 1.0, "step": 0.01,
                          "tooltip": "The amount of denoising applied, lower values will "
                          "maintain the structure of the initial image allowing for image to "
                          "image sampling."}],
}}, ["LATENT"], display_name="KSampler",
    description="Uses the provided model, positive and negative conditioning to denoise the "
    "latent image.", python_module="nodes", category="sampling", output_node=False,
    output_tooltips=["The denoised latent."])  # fmt: skip

UNET_LOADER = _v1("UNETLoader", {"required": {
    "unet_name": [["flux1-dev-fp8.safetensors"]],
    "weight_dtype": [["default", "fp8_e4m3fn", "fp8_e4m3fn_fast", "fp8_e5m2"]],
}}, ["MODEL"], display_name="Load Diffusion Model", description="", python_module="nodes",
    category="advanced/loaders", output_node=False)  # fmt: skip

VAE_LOADER = _v1("VAELoader", {"required": {
    "vae_name": [["ae.safetensors", "taesd", "pixel_space"]],
}}, ["VAE"], display_name="Load VAE", description="", python_module="nodes",
    category="loaders", output_node=False)  # fmt: skip

EMPTY_IMAGE = _v1("EmptyImage", {"required": {
    "width": ["INT", {"default": 512, "min": 1, "max": 16384, "step": 1}],
    "height": ["INT", {"default": 512, "min": 1, "max": 16384, "step": 1}],
    "batch_size": ["INT", {"default": 1, "min": 1, "max": 4096}],
    "color": ["INT", {"default": 0, "min": 0, "max": 0xFFFFFF, "step": 1, "display": "color"}],
}}, ["IMAGE"], display_name="EmptyImage", description="", python_module="nodes",
    category="image", output_node=False)  # fmt: skip

DUAL_CLIP_LOADER = _v1("DualCLIPLoader", {
    "required": {
        "clip_name1": [["clip_l.safetensors", "t5xxl_fp8_e4m3fn.safetensors"]],
        "clip_name2": [["clip_l.safetensors", "t5xxl_fp8_e4m3fn.safetensors"]],
        "type": [["sdxl", "sd3", "flux", "hunyuan_video", "hidream", "hunyuan_image"]],
    },
    "optional": {"device": [["default", "cpu"], {"advanced": True}]},
}, ["CLIP"], display_name="DualCLIPLoader",
    description="[Recipes]\n\nsdxl: clip-l, clip-g\nsd3: clip-l, clip-g / clip-l, t5 / clip-g, "
    "t5\nflux: clip-l, t5\nhidream: at least one of t5 or llama, recommended t5 and llama\n"
    "hunyuan_image: qwen2.5vl 7b and byt5 small",
    python_module="nodes", category="advanced/loaders", output_node=False)  # fmt: skip

PREVIEW_IMAGE = _v1("PreviewImage", {
    "required": {"images": ["IMAGE"]},
    "hidden": {"prompt": "PROMPT", "extra_pnginfo": "EXTRA_PNGINFO"},
}, [], display_name="Preview Image",
    description="Saves the input images to your ComfyUI output directory.",
    python_module="nodes", category="image", output_node=True)  # fmt: skip

CONTROLNET_APPLY = _v1("ControlNetApply", {"required": {
    "conditioning": ["CONDITIONING"], "control_net": ["CONTROL_NET"], "image": ["IMAGE"],
    "strength": ["FLOAT", {"default": 1.0, "min": 0.0, "max": 10.0, "step": 0.01}],
}}, ["CONDITIONING"], display_name="Apply ControlNet (OLD)", description="",
    python_module="nodes", category="conditioning/controlnet", output_node=False,
    deprecated=True)  # fmt: skip


def _v3(name: str, inputs: dict[str, Any], output: list[str], **rest: Any) -> dict[str, Any]:
    """asdict(NodeInfoV1) from Schema.get_v1_info, in the dataclass's field order."""
    return {
        "input": inputs, "input_order": {k: list(v) for k, v in inputs.items()},
        "output": output, "output_is_list": [False] * len(output), "output_name": output,
        "output_tooltips": [None] * len(output), "name": name,
        "display_name": rest["display_name"], "description": "",
        "python_module": rest["python_module"], "category": rest["category"],
        "output_node": False, "deprecated": False, "experimental": False, "api_node": False,
    }  # fmt: skip


UPSCALE_MODEL_LOADER = _v3("UpscaleModelLoader", {"required": {
    "model_name": ["COMBO", {"multiselect": False, "options": ["4x-UltraSharp.pth"]}],
}}, ["UPSCALE_MODEL"], display_name="Load Upscale Model",
    python_module="comfy_extras.nodes_upscale_model", category="loaders")  # fmt: skip

FLUX_GUIDANCE = _v3("FluxGuidance", {"required": {
    "conditioning": ["CONDITIONING", {}],
    "guidance": ["FLOAT", {"default": 3.5, "min": 0.0, "max": 100.0, "step": 0.1}],
}}, ["CONDITIONING"], display_name=None, python_module="comfy_extras.nodes_flux",
    category="advanced/conditioning/flux")  # fmt: skip

EXPECTED = (
    KSAMPLER, UNET_LOADER, VAE_LOADER, EMPTY_IMAGE, DUAL_CLIP_LOADER, PREVIEW_IMAGE,
    CONTROLNET_APPLY, UPSCALE_MODEL_LOADER, FLUX_GUIDANCE,
)  # fmt: skip


async def _get(session: aiohttp.ClientSession, url: str) -> tuple[int, str, bytes]:
    async with session.get(url) as resp:
        return resp.status, resp.content_type, await resp.read()


async def _post(session: aiohttp.ClientSession, url: str, prompt: Any) -> tuple[int, Any]:
    async with session.post(f"{url}/prompt", json={"prompt": prompt}) as resp:
        return resp.status, await resp.json()


async def test_object_info_entries_are_those_of_comfyui_0_3_64(
    make_comfy, session: aiohttp.ClientSession
):
    sim = await make_comfy(models=(*MODELS, *TAESD_FILES, UPSCALER))
    status, kind, raw = await _get(session, f"{sim.url}/object_info")
    assert (status, kind) == (200, "application/json")
    catalog = json.loads(raw)
    for expected in EXPECTED:
        entry = catalog[expected["name"]]
        assert entry == expected, expected["name"]
        # The same keys in the same order: the JSON text is 0.3.64's too.
        assert json.dumps(entry) == json.dumps(expected), expected["name"]
    # NODE_CLASS_MAPPINGS order: nodes.py's classes first, then comfy_extras' as they load.
    assert list(catalog)[:3] == ["KSampler", "CheckpointLoaderSimple", "CLIPTextEncode"]
    assert list(catalog)[-3:] == ["ImageUpscaleWithModel", "MaskToImage", "FluxGuidance"]


async def test_object_info_of_one_class_known_or_not(
    comfy: SimComfyUI, session: aiohttp.ClientSession
):
    _, _, whole = await _get(session, f"{comfy.url}/object_info")
    for prefix in ("", "/api"):
        status, kind, raw = await _get(session, f"{comfy.url}{prefix}/object_info/KSampler")
        assert (status, kind) == (200, "application/json")
        assert json.loads(raw) == {"KSampler": json.loads(whole)["KSampler"]}
        status, kind, raw = await _get(session, f"{comfy.url}{prefix}/object_info/NoSuchNode")
        assert (status, kind, json.loads(raw)) == (200, "application/json", {})
    _, _, twin = await _get(session, f"{comfy.url}/api/object_info")
    assert twin == whole


async def test_loader_lists_are_read_anew_on_each_request(
    comfy: SimComfyUI, session: aiohttp.ClientSession
):
    url = f"{comfy.url}/object_info/CheckpointLoaderSimple"
    first = json.loads((await _get(session, url))[2])
    assert first["CheckpointLoaderSimple"]["input"]["required"]["ckpt_name"][0] == [SD15]
    added = ComfyModelFile("checkpoints", "a-first.safetensors", 2 * 1024 * MiB)
    comfy.spec = attrs.evolve(comfy.spec, models=(*comfy.spec.models, added))
    second = json.loads((await _get(session, url))[2])
    assert second["CheckpointLoaderSimple"]["input"]["required"]["ckpt_name"][0] == [
        "a-first.safetensors",
        SD15,
    ]


async def test_unet_loader_without_weight_dtype_is_refused(
    comfy: SimComfyUI, session: aiohttp.ClientSession
):
    prompt = flux()
    del prompt["1"]["inputs"]["weight_dtype"]
    status, body = await _post(session, comfy.url, prompt)
    assert status == 400
    assert body == {
        "error": {"type": "prompt_outputs_failed_validation",
                  "message": "Prompt outputs failed validation", "details": "",
                  "extra_info": {}},
        "node_errors": {"1": {
            "errors": [{"type": "required_input_missing", "message": "Required input is missing",
                        "details": "weight_dtype", "extra_info": {"input_name": "weight_dtype"}}],
            "dependent_outputs": ["9"],
            "class_type": "UNETLoader",
        }},
    }  # fmt: skip
    assert comfy.queue.tasks_remaining() == 0


async def test_every_sampler_and_scheduler_of_0_3_64_is_accepted(
    comfy: SimComfyUI, session: aiohttp.ClientSession
):
    socket = await connect(session, comfy.url, "me")
    for sampler, scheduler in (("sa_solver_pece", "kl_optimal"), ("dpmpp_2m_sde_gpu", "beta")):
        prompt = txt2img()
        prompt["3"]["inputs"].update(sampler_name=sampler, scheduler=scheduler)
        prompt_id = await queue(session, comfy.url, prompt, client_id="me")
        events = await socket.until_done(prompt_id)
        assert "execution_success" in [e["type"] for e in events]
    prompt = txt2img()
    prompt["3"]["inputs"]["sampler_name"] = "euler_b"
    status, body = await _post(session, comfy.url, prompt)
    reason = body["node_errors"]["3"]["errors"][0]
    assert (status, reason["type"], reason["details"]) == (
        400,
        "value_not_in_list",
        "sampler_name: 'euler_b' not in (list of length 42)",
    )
    # Upstream does not send back a list longer than 20 values.
    assert reason["extra_info"]["input_config"] is None


async def test_the_gates_catalog_reader_reads_every_class(
    comfy: SimComfyUI, session: aiohttp.ClientSession
):
    served = json.loads((await _get(session, f"{comfy.url}/object_info"))[2])
    catalog = parse_object_info(served)
    assert set(catalog.nodes) == set(served)
    # All of ComfyUI's own classes without a validation function: decided from the catalog.
    assert [n.name for n in catalog.nodes.values() if n.by_code] == []
    assert catalog.custom_modules == frozenset()
    vae = catalog.nodes["VAELoader"].input("vae_name")
    assert vae is not None and vae.kind is InputKind.LIST
    assert vae.choices == ("ae.safetensors", "pixel_space")
    upscale = catalog.nodes["UpscaleModelLoader"].input("model_name")
    assert upscale is not None and upscale.kind is InputKind.OTHER
    assert catalog.nodes["SaveImage"].output_node is True
