"""The node classes the simulated ComfyUI knows, declared as ComfyUI 0.3.64 declares them.

Inputs, options, tooltips, categories and descriptions are nodes.py's `INPUT_TYPES` and
class attributes, or a comfy_extras `io.Schema`, word for word: `/object_info` serves them
and validation echoes them in `input_config`, so a difference here is one a client sees.
Combo inputs over model files list the files the host has in that folder, as
`folder_paths.get_filename_list` does.
"""

from __future__ import annotations

from typing import Any

from gpugate.sim.comfyui.custom_pack import PACKS
from gpugate.sim.comfyui.image_nodes import IMAGE_NODES, LOAD_IMAGE_OUTPUT, MASK_TO_IMAGE
from gpugate.sim.comfyui.nodetypes import (
    CLIP_TYPES,
    DUAL_CLIP_TYPES,
    MAX_RESOLUTION,
    MODEL_FOLDERS,
    PIXEL_SPACE,
    PRIMITIVES,
    SAMPLERS,
    SCHEDULERS,
    TAESD,
    WEIGHT_DTYPES,
    Api,
    InputDef,
    NodeDef,
    Work,
    vae_list,
)

__all__ = [
    "CLIP_TYPES", "DUAL_CLIP_TYPES", "MAX_RESOLUTION", "MODEL_FOLDERS", "NODES", "PIXEL_SPACE",
    "PRIMITIVES", "SAMPLERS", "SCHEDULERS", "TAESD", "WEIGHT_DTYPES", "Api", "InputDef",
    "NodeDef", "Work", "node_table", "vae_list",
]  # fmt: skip


def _in(name: str, kind: str, **options: Any) -> InputDef:
    return InputDef(name, kind, options)


def _file(name: str, folder: str, **options: Any) -> InputDef:
    return InputDef(name, "COMBO", options, folder=folder)


def _pick(name: str, choices: tuple[str, ...], required: bool = True, **options: Any) -> InputDef:
    return InputDef(name, "COMBO", options, choices=choices, required=required)


def _v3(name: str, kind: str, folder: str | None = None, **options: Any) -> InputDef:
    return InputDef(name, kind, options, folder=folder, api=Api.V3)


_DEVICE = _pick("device", ("default", "cpu"), required=False, advanced=True)
_SAVE_HIDDEN = (("prompt", "PROMPT"), ("extra_pnginfo", "EXTRA_PNGINFO"))
_SAVE_DESCRIPTION = "Saves the input images to your ComfyUI output directory."

# In NODE_CLASS_MAPPINGS order: nodes.py's classes, then comfy_extras' as they load.
_TABLE = (
    NodeDef("KSampler", Work.SAMPLE, (
        _in("model", "MODEL", tooltip="The model used for denoising the input latent."),
        _in("seed", "INT", default=0, min=0, max=0xFFFFFFFFFFFFFFFF, control_after_generate=True,
            tooltip="The random seed used for creating the noise."),
        _in("steps", "INT", default=20, min=1, max=10000,
            tooltip="The number of steps used in the denoising process."),
        _in("cfg", "FLOAT", default=8.0, min=0.0, max=100.0, step=0.1, round=0.01,
            tooltip="The Classifier-Free Guidance scale balances creativity and adherence to "
            "the prompt. Higher values result in images more closely matching the prompt "
            "however too high values will negatively impact quality."),
        _pick("sampler_name", SAMPLERS,
              tooltip="The algorithm used when sampling, this can affect the quality, speed, "
              "and style of the generated output."),
        _pick("scheduler", SCHEDULERS,
              tooltip="The scheduler controls how noise is gradually removed to form the image."),
        _in("positive", "CONDITIONING",
            tooltip="The conditioning describing the attributes you want to include in the "
            "image."),
        _in("negative", "CONDITIONING",
            tooltip="The conditioning describing the attributes you want to exclude from the "
            "image."),
        _in("latent_image", "LATENT", tooltip="The latent image to denoise."),
        _in("denoise", "FLOAT", default=1.0, min=0.0, max=1.0, step=0.01,
            tooltip="The amount of denoising applied, lower values will maintain the structure "
            "of the initial image allowing for image to image sampling."),
    ), ("LATENT",), "sampling", "KSampler",
        "Uses the provided model, positive and negative conditioning to denoise the latent image.",
        ("The denoised latent.",)),
    NodeDef("CheckpointLoaderSimple", Work.LOAD_CHECKPOINT, (
        _file("ckpt_name", "checkpoints", tooltip="The name of the checkpoint (model) to load."),
    ), ("MODEL", "CLIP", "VAE"), "loaders", "Load Checkpoint",
        "Loads a diffusion model checkpoint, diffusion models are used to denoise latents.",
        ("The model used for denoising latents.",
         "The CLIP model used for encoding text prompts.",
         "The VAE model used for encoding and decoding images to and from latent space.")),
    NodeDef("CLIPTextEncode", Work.ENCODE_TEXT, (
        _in("text", "STRING", multiline=True, dynamicPrompts=True,
            tooltip="The text to be encoded."),
        _in("clip", "CLIP", tooltip="The CLIP model used for encoding the text."),
    ), ("CONDITIONING",), "conditioning", "CLIP Text Encode (Prompt)",
        "Encodes a text prompt using a CLIP model into an embedding that can be used to guide "
        "the diffusion model towards generating specific images.",
        ("A conditioning containing the embedded text used to guide the diffusion model.",)),
    NodeDef("VAEDecode", Work.DECODE, (
        _in("samples", "LATENT", tooltip="The latent to be decoded."),
        _in("vae", "VAE", tooltip="The VAE model used for decoding the latent."),
    ), ("IMAGE",), "latent", "VAE Decode",
        "Decodes latent images back into pixel space images.", ("The decoded image.",)),
    NodeDef("VAELoader", Work.LOAD_VAE, (InputDef("vae_name", "COMBO", vaes=True),),
            ("VAE",), "loaders", "Load VAE"),
    NodeDef("EmptyLatentImage", Work.EMPTY_LATENT, (
        _in("width", "INT", default=512, min=16, max=MAX_RESOLUTION, step=8,
            tooltip="The width of the latent images in pixels."),
        _in("height", "INT", default=512, min=16, max=MAX_RESOLUTION, step=8,
            tooltip="The height of the latent images in pixels."),
        _in("batch_size", "INT", default=1, min=1, max=4096,
            tooltip="The number of latent images in the batch."),
    ), ("LATENT",), "latent", "Empty Latent Image",
        "Create a new batch of empty latent images to be denoised via sampling.",
        ("The empty latent image batch.",)),
    NodeDef("SaveImage", Work.SAVE_IMAGE, (
        _in("images", "IMAGE", tooltip="The images to save."),
        _in("filename_prefix", "STRING", default="ComfyUI",
            tooltip="The prefix for the file to save. This may include formatting information "
            "such as %date:yyyy-MM-dd% or %Empty Latent Image.width% to include values from "
            "nodes."),
    ), (), "image", "Save Image", _SAVE_DESCRIPTION, output_node=True, hidden=_SAVE_HIDDEN),
    # A subclass of SaveImage: its description and category are SaveImage's.
    NodeDef("PreviewImage", Work.PREVIEW_IMAGE, (_in("images", "IMAGE"),), (), "image",
            "Preview Image", _SAVE_DESCRIPTION, output_node=True, hidden=_SAVE_HIDDEN),
    NodeDef("EmptyImage", Work.EMPTY_IMAGE, (
        _in("width", "INT", default=512, min=1, max=MAX_RESOLUTION, step=1),
        _in("height", "INT", default=512, min=1, max=MAX_RESOLUTION, step=1),
        _in("batch_size", "INT", default=1, min=1, max=4096),
        _in("color", "INT", default=0, min=0, max=0xFFFFFF, step=1, display="color"),
    ), ("IMAGE",), "image"),
    NodeDef("LoraLoader", Work.LOAD_LORA, (
        _in("model", "MODEL", tooltip="The diffusion model the LoRA will be applied to."),
        _in("clip", "CLIP", tooltip="The CLIP model the LoRA will be applied to."),
        _file("lora_name", "loras", tooltip="The name of the LoRA."),
        _in("strength_model", "FLOAT", default=1.0, min=-100.0, max=100.0, step=0.01,
            tooltip="How strongly to modify the diffusion model. This value can be negative."),
        _in("strength_clip", "FLOAT", default=1.0, min=-100.0, max=100.0, step=0.01,
            tooltip="How strongly to modify the CLIP model. This value can be negative."),
    ), ("MODEL", "CLIP"), "loaders", "Load LoRA",
        "LoRAs are used to modify diffusion and CLIP models, altering the way in which latents "
        "are denoised such as applying styles. Multiple LoRA nodes can be linked together.",
        ("The modified diffusion model.", "The modified CLIP model.")),
    NodeDef("CLIPLoader", Work.LOAD_FILE, (
        _file("clip_name", "text_encoders"), _pick("type", CLIP_TYPES), _DEVICE,
    ), ("CLIP",), "advanced/loaders", "Load CLIP",
        "[Recipes]\n\nstable_diffusion: clip-l\nstable_cascade: clip-g\nsd3: t5 xxl/ clip-g / "
        "clip-l\nstable_audio: t5 base\nmochi: t5 xxl\ncosmos: old t5 xxl\nlumina2: gemma 2 "
        "2B\nwan: umt5 xxl\n hidream: llama-3.1 (Recommend) or t5\nomnigen2: qwen vl 2.5 3B",
        folder="text_encoders", role="clip"),
    NodeDef("UNETLoader", Work.LOAD_FILE, (
        _file("unet_name", "diffusion_models"), _pick("weight_dtype", WEIGHT_DTYPES),
    ), ("MODEL",), "advanced/loaders", "Load Diffusion Model",
        folder="diffusion_models", role="model"),
    NodeDef("DualCLIPLoader", Work.LOAD_DUAL_CLIP, (
        _file("clip_name1", "text_encoders"), _file("clip_name2", "text_encoders"),
        _pick("type", DUAL_CLIP_TYPES), _DEVICE,
    ), ("CLIP",), "advanced/loaders", None,
        "[Recipes]\n\nsdxl: clip-l, clip-g\nsd3: clip-l, clip-g / clip-l, t5 / clip-g, t5\n"
        "flux: clip-l, t5\nhidream: at least one of t5 or llama, recommended t5 and llama\n"
        "hunyuan_image: qwen2.5vl 7b and byt5 small"),
    NodeDef("ControlNetApply", Work.APPLY_CONTROLNET, (
        _in("conditioning", "CONDITIONING"), _in("control_net", "CONTROL_NET"),
        _in("image", "IMAGE"),
        _in("strength", "FLOAT", default=1.0, min=0.0, max=10.0, step=0.01),
    ), ("CONDITIONING",), "conditioning/controlnet", "Apply ControlNet (OLD)",
        deprecated=True),
    NodeDef("ControlNetLoader", Work.LOAD_FILE, (_file("control_net_name", "controlnet"),),
            ("CONTROL_NET",), "loaders", "Load ControlNet Model",
            folder="controlnet", role="controlnet"),
    NodeDef("UpscaleModelLoader", Work.LOAD_FILE, (_v3("model_name", "COMBO", "upscale_models"),),
            ("UPSCALE_MODEL",), "loaders", "Load Upscale Model", output_tooltips=(None,),
            api=Api.V3, python_module="comfy_extras.nodes_upscale_model",
            folder="upscale_models", role="upscale"),
    NodeDef("ImageUpscaleWithModel", Work.UPSCALE, (
        _v3("upscale_model", "UPSCALE_MODEL"), _v3("image", "IMAGE"),
    ), ("IMAGE",), "image/upscaling", "Upscale Image (using Model)", output_tooltips=(None,),
        api=Api.V3, python_module="comfy_extras.nodes_upscale_model"),
    NodeDef("FluxGuidance", Work.GUIDANCE, (
        _v3("conditioning", "CONDITIONING"),
        _v3("guidance", "FLOAT", default=3.5, min=0.0, max=100.0, step=0.1),
    ), ("CONDITIONING",), "advanced/conditioning/flux", output_tooltips=(None,),
        api=Api.V3, python_module="comfy_extras.nodes_flux"),
)  # fmt: skip

_IMAGES = {node.class_type: node for node in (*IMAGE_NODES, LOAD_IMAGE_OUTPUT)}
_ORDER = (
    "KSampler", "CheckpointLoaderSimple", "CLIPTextEncode", "VAEDecode", "VAEEncode",
    "VAELoader", "EmptyLatentImage", "SaveImage", "PreviewImage", "LoadImage", "LoadImageMask",
    "LoadImageOutput", "ImageScale", "ImageInvert", "EmptyImage", "LoraLoader", "CLIPLoader",
    "UNETLoader", "DualCLIPLoader", "ControlNetApply", "ControlNetLoader", "UpscaleModelLoader",
    "ImageUpscaleWithModel", "MaskToImage", "FluxGuidance",
)  # fmt: skip
NODES: dict[str, NodeDef] = {
    name: node
    for name in _ORDER
    for node in (*_TABLE, *_IMAGES.values(), MASK_TO_IMAGE)
    if node.class_type == name
}
"""By class name, in the order ComfyUI 0.3.64 registers them (NODE_CLASS_MAPPINGS)."""


def node_table(packs: tuple[str, ...] = ()) -> dict[str, NodeDef]:
    """NODES and the classes of the named custom node packs (custom_pack.PACKS), as
    ComfyUI registers custom nodes after its own."""
    table = dict(NODES)
    for pack in packs:
        table.update({node.class_type: node for node in PACKS[pack]})
    return table
