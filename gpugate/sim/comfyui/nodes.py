"""The node classes the simulated ComfyUI knows: their inputs, outputs and kind of work.

Inputs are declared as ComfyUI's `INPUT_TYPES` declare them (type, then options), so that
validation answers with the same `input_config`. Combo inputs over model files list the
files the host has in that folder, as `folder_paths.get_filename_list` does.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Any

import attrs

MAX_RESOLUTION = 16384
MODEL_FOLDERS = (
    "checkpoints", "configs", "loras", "vae", "text_encoders", "diffusion_models",
    "clip_vision", "style_models", "embeddings", "diffusers", "vae_approx", "controlnet",
    "gligen", "upscale_models", "latent_upscale_models", "custom_nodes", "hypernetworks",
    "photomaker", "classifiers", "model_patches", "audio_encoders",
)  # fmt: skip
"""`folder_paths.folder_names_and_paths` keys, in their order (GET /models)."""
SAMPLERS = (
    "euler", "euler_cfg_pp", "euler_ancestral", "euler_ancestral_cfg_pp", "heun", "heunpp2",
    "dpm_2", "dpm_2_ancestral", "lms", "dpm_fast", "dpm_adaptive", "dpmpp_2s_ancestral",
    "dpmpp_sde", "dpmpp_2m", "dpmpp_2m_sde", "dpmpp_3m_sde", "ddpm", "lcm", "ipndm", "deis",
    "res_multistep", "gradient_estimation", "er_sde", "seeds_2", "seeds_3", "ddim", "uni_pc",
    "uni_pc_bh2",
)  # fmt: skip
SCHEDULERS = (
    "simple", "sgm_uniform", "karras", "exponential", "ddim_uniform", "beta", "normal",
    "linear_quadratic", "kl_optimal",
)  # fmt: skip
CLIP_TYPES = (
    "stable_diffusion", "stable_cascade", "sd3", "stable_audio", "mochi", "ltxv", "pixart",
    "cosmos", "lumina2", "wan", "hidream", "chroma", "ace", "omnigen2", "qwen_image",
    "hunyuan_image",
)  # fmt: skip
DUAL_CLIP_TYPES = ("sdxl", "sd3", "flux", "hunyuan_video", "hidream", "hunyuan_image")
WEIGHT_DTYPES = ("default", "fp8_e4m3fn", "fp8_e4m3fn_fast", "fp8_e5m2")
PRIMITIVES = ("INT", "FLOAT", "STRING", "BOOLEAN")


class Work(enum.Enum):
    """What a node does when it runs (gpugate.sim.comfyui.work carries it out)."""

    LOAD_CHECKPOINT = "load_checkpoint"
    LOAD_FILE = "load_file"
    LOAD_DUAL_CLIP = "load_dual_clip"
    LOAD_LORA = "load_lora"
    ENCODE_TEXT = "encode_text"
    GUIDANCE = "guidance"
    APPLY_CONTROLNET = "apply_controlnet"
    EMPTY_LATENT = "empty_latent"
    SAMPLE = "sample"
    DECODE = "decode"
    UPSCALE = "upscale"
    EMPTY_IMAGE = "empty_image"
    SAVE_IMAGE = "save_image"
    PREVIEW_IMAGE = "preview_image"


@attrs.frozen
class InputDef:
    """One declared input: a primitive with options, a combo, or a link of a type."""

    name: str
    type: str
    """INT, FLOAT, STRING, BOOLEAN, COMBO, or a link type such as MODEL."""
    options: Mapping[str, Any] = attrs.field(factory=dict)
    folder: str | None = None
    """A combo over the model files of this folder."""
    choices: tuple[str, ...] = ()
    """A combo over fixed values."""
    required: bool = True

    @property
    def is_link(self) -> bool:
        return self.type not in (*PRIMITIVES, "COMBO")

    def combo(self, files: Mapping[str, list[str]]) -> list[str]:
        """The values a combo accepts."""
        return list(files.get(self.folder, [])) if self.folder else list(self.choices)

    def config(self, files: Mapping[str, list[str]]) -> list[Any]:
        """The input as INPUT_TYPES declares it: `[type or values, options]`."""
        head: Any = self.combo(files) if self.type == "COMBO" else self.type
        return [head, dict(self.options)] if self.options else [head]


@attrs.frozen
class NodeDef:
    class_type: str
    work: Work
    inputs: tuple[InputDef, ...]
    outputs: tuple[str, ...]
    output_node: bool = False
    folder: str | None = None
    """Where LOAD_FILE finds its file."""
    role: str = ""
    """What LOAD_FILE produces: the role of its weights (model, clip, vae, ...)."""

    def input(self, name: str) -> InputDef | None:
        return next((i for i in self.inputs if i.name == name), None)


def _int(name: str, default: int, lo: int, hi: int, step: int = 1, **more: Any) -> InputDef:
    return InputDef(name, "INT", {"default": default, "min": lo, "max": hi, "step": step, **more})


def _float(name: str, default: float, lo: float, hi: float, step: float, **more: Any) -> InputDef:
    options = {"default": default, "min": lo, "max": hi, "step": step, **more}
    return InputDef(name, "FLOAT", options)


def _file(name: str, folder: str) -> InputDef:
    return InputDef(name, "COMBO", folder=folder)


def _link(name: str, kind: str) -> InputDef:
    return InputDef(name, kind)


def _loader(class_type: str, name: str, folder: str, output: str, role: str) -> NodeDef:
    return NodeDef(class_type, Work.LOAD_FILE, (_file(name, folder),), (output,),
                   folder=folder, role=role)  # fmt: skip


_SIZE = dict(lo=16, hi=MAX_RESOLUTION, step=8)
NODES: dict[str, NodeDef] = {
    node.class_type: node
    for node in (
        NodeDef("CheckpointLoaderSimple", Work.LOAD_CHECKPOINT,
                (_file("ckpt_name", "checkpoints"),), ("MODEL", "CLIP", "VAE")),
        _loader("UNETLoader", "unet_name", "diffusion_models", "MODEL", "model"),
        _loader("VAELoader", "vae_name", "vae", "VAE", "vae"),
        _loader("ControlNetLoader", "control_net_name", "controlnet", "CONTROL_NET", "controlnet"),
        _loader("UpscaleModelLoader", "model_name", "upscale_models", "UPSCALE_MODEL", "upscale"),
        NodeDef("CLIPLoader", Work.LOAD_FILE,
                (_file("clip_name", "text_encoders"),
                 InputDef("type", "COMBO", choices=CLIP_TYPES),
                 InputDef("device", "COMBO", choices=("default", "cpu"), required=False)),
                ("CLIP",), folder="text_encoders", role="clip"),
        NodeDef("DualCLIPLoader", Work.LOAD_DUAL_CLIP,
                (_file("clip_name1", "text_encoders"), _file("clip_name2", "text_encoders"),
                 InputDef("type", "COMBO", choices=DUAL_CLIP_TYPES),
                 InputDef("device", "COMBO", choices=("default", "cpu"), required=False)),
                ("CLIP",)),
        NodeDef("LoraLoader", Work.LOAD_LORA,
                (_link("model", "MODEL"), _link("clip", "CLIP"), _file("lora_name", "loras"),
                 _float("strength_model", 1.0, -100.0, 100.0, 0.01),
                 _float("strength_clip", 1.0, -100.0, 100.0, 0.01)),
                ("MODEL", "CLIP")),
        NodeDef("CLIPTextEncode", Work.ENCODE_TEXT,
                (InputDef("text", "STRING", {"multiline": True, "dynamicPrompts": True}),
                 _link("clip", "CLIP")),
                ("CONDITIONING",)),
        NodeDef("FluxGuidance", Work.GUIDANCE,
                (_link("conditioning", "CONDITIONING"), _float("guidance", 3.5, 0.0, 100.0, 0.1)),
                ("CONDITIONING",)),
        NodeDef("ControlNetApply", Work.APPLY_CONTROLNET,
                (_link("conditioning", "CONDITIONING"), _link("control_net", "CONTROL_NET"),
                 _link("image", "IMAGE"), _float("strength", 1.0, 0.0, 10.0, 0.01)),
                ("CONDITIONING",)),
        NodeDef("EmptyLatentImage", Work.EMPTY_LATENT,
                (_int("width", 512, **_SIZE), _int("height", 512, **_SIZE),
                 _int("batch_size", 1, 1, 4096)),
                ("LATENT",)),
        NodeDef("KSampler", Work.SAMPLE,
                (_link("model", "MODEL"),
                 _int("seed", 0, 0, 0xFFFFFFFFFFFFFFFF, control_after_generate=True),
                 _int("steps", 20, 1, 10000), _float("cfg", 8.0, 0.0, 100.0, 0.1, round=0.01),
                 InputDef("sampler_name", "COMBO", choices=SAMPLERS),
                 InputDef("scheduler", "COMBO", choices=SCHEDULERS),
                 _link("positive", "CONDITIONING"), _link("negative", "CONDITIONING"),
                 _link("latent_image", "LATENT"), _float("denoise", 1.0, 0.0, 1.0, 0.01)),
                ("LATENT",)),
        NodeDef("VAEDecode", Work.DECODE,
                (_link("samples", "LATENT"), _link("vae", "VAE")), ("IMAGE",)),
        NodeDef("ImageUpscaleWithModel", Work.UPSCALE,
                (_link("upscale_model", "UPSCALE_MODEL"), _link("image", "IMAGE")), ("IMAGE",)),
        NodeDef("EmptyImage", Work.EMPTY_IMAGE,
                (_int("width", 512, 1, MAX_RESOLUTION), _int("height", 512, 1, MAX_RESOLUTION),
                 _int("batch_size", 1, 1, 4096),
                 _int("color", 0, 0, 0xFFFFFF, display="color")),
                ("IMAGE",)),
        NodeDef("SaveImage", Work.SAVE_IMAGE,
                (_link("images", "IMAGE"),
                 InputDef("filename_prefix", "STRING", {"default": "ComfyUI"})),
                (), output_node=True),
        NodeDef("PreviewImage", Work.PREVIEW_IMAGE, (_link("images", "IMAGE"),), (),
                output_node=True),
    )
}  # fmt: skip
