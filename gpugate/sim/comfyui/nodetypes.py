"""What a node class of the simulated ComfyUI is made of: inputs, outputs, kind of work.

The classes themselves are in nodes.py; catalog.py writes them as `/object_info` does.
"""

from __future__ import annotations

import enum
import mimetypes
import os
from collections.abc import Callable, Mapping
from pathlib import Path
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
    "dpmpp_2s_ancestral_cfg_pp", "dpmpp_sde", "dpmpp_sde_gpu", "dpmpp_2m", "dpmpp_2m_cfg_pp",
    "dpmpp_2m_sde", "dpmpp_2m_sde_gpu", "dpmpp_2m_sde_heun", "dpmpp_2m_sde_heun_gpu",
    "dpmpp_3m_sde", "dpmpp_3m_sde_gpu", "ddpm", "lcm", "ipndm", "ipndm_v", "deis",
    "res_multistep", "res_multistep_cfg_pp", "res_multistep_ancestral",
    "res_multistep_ancestral_cfg_pp", "gradient_estimation", "gradient_estimation_cfg_pp",
    "er_sde", "seeds_2", "seeds_3", "sa_solver", "sa_solver_pece", "ddim", "uni_pc",
    "uni_pc_bh2",
)  # fmt: skip
"""comfy/samplers.py `KSampler.SAMPLERS`: KSAMPLER_NAMES, then ddim, uni_pc, uni_pc_bh2."""
SCHEDULERS = (
    "simple", "sgm_uniform", "karras", "exponential", "ddim_uniform", "beta", "normal",
    "linear_quadratic", "kl_optimal",
)  # fmt: skip
"""comfy/samplers.py `KSampler.SCHEDULERS`: the keys of SCHEDULER_HANDLERS."""
CLIP_TYPES = (
    "stable_diffusion", "stable_cascade", "sd3", "stable_audio", "mochi", "ltxv", "pixart",
    "cosmos", "lumina2", "wan", "hidream", "chroma", "ace", "omnigen2", "qwen_image",
    "hunyuan_image",
)  # fmt: skip
DUAL_CLIP_TYPES = ("sdxl", "sd3", "flux", "hunyuan_video", "hidream", "hunyuan_image")
WEIGHT_DTYPES = ("default", "fp8_e4m3fn", "fp8_e4m3fn_fast", "fp8_e5m2")
PRIMITIVES = ("INT", "FLOAT", "STRING", "BOOLEAN")
TAESD = (
    ("taesd", "taesd_encoder.", "taesd_decoder."),
    ("taesdxl", "taesdxl_encoder.", "taesdxl_decoder."),
    ("taesd3", "taesd3_encoder.", "taesd3_decoder."),
    ("taef1", "taef1_encoder.", "taef1_decoder."),
)
"""VAELoader's tiny autoencoders: the name offered, and the vae_approx files it needs."""
PIXEL_SPACE = "pixel_space"
INPUT_IMAGES = "<input images>"
"""The key under which `files` lists the input folder's images (LoadImage's combo)."""
INPUT_FILES = "<input files>"
"""The key under which `files` lists the input folder's files (LoadImageMask's combo)."""


def _content_type(name: str) -> str:
    """folder_paths.filter_files_content_types: the MIME type's first half, by the name."""
    kind = mimetypes.guess_type(name, strict=False)[0]
    return "" if kind is None else kind.split("/")[0]


def input_listing(input_dir: Path) -> dict[str, list[str]]:
    """nodes.py `LoadImage.INPUT_TYPES` and `LoadImageMask.INPUT_TYPES`: the input folder's
    files, and those `folder_paths.filter_files_content_types` takes for images (a type
    `mimetypes.guess_type` gives from the name), sorted."""
    try:
        names = [n for n in os.listdir(input_dir) if os.path.isfile(os.path.join(input_dir, n))]
    except OSError:
        names = []
    images = [n for n in names if _content_type(n) == "image"]
    return {INPUT_FILES: sorted(names), INPUT_IMAGES: sorted(images)}


class Api(enum.Enum):
    """How a class is written upstream, which decides the shape of its `/object_info` entry."""

    V1 = "INPUT_TYPES"
    """A nodes.py class: server.py `node_info` reads its attributes."""
    V3 = "io.ComfyNode"
    """A comfy_extras `io.Schema`: `GET_NODE_INFO_V1` writes every field, nulls included."""


class Work(enum.Enum):
    """What a node does when it runs (gpugate.sim.comfyui.work carries it out)."""

    LOAD_CHECKPOINT = "load_checkpoint"
    LOAD_FILE = "load_file"
    LOAD_VAE = "load_vae"
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
    LOAD_IMAGE = "load_image"
    PASS_IMAGE = "pass_image"
    """Its image (or mask) goes on unchanged: a resize, an invert, a conversion."""
    ENCODE_IMAGE = "encode_image"


def vae_list(files: Mapping[str, list[str]]) -> list[str]:
    """nodes.py `VAELoader.vae_list`: the vae folder, tiny autoencoders whose two files
    exist, and pixel_space always."""
    approx = files.get("vae_approx", [])
    found = [
        name
        for name, encoder, decoder in TAESD
        if any(v.startswith(encoder) for v in approx) and any(v.startswith(decoder) for v in approx)
    ]
    return [*files.get("vae", []), *found, PIXEL_SPACE]


@attrs.frozen
class InputDef:
    """One declared input: a primitive with options, a combo, or a link of a type."""

    name: str
    type: str
    """INT, FLOAT, STRING, BOOLEAN, COMBO, or a link type such as MODEL."""
    options: Mapping[str, Any] = attrs.field(factory=dict)
    """The declaration's options, in their order (a V3 combo's values are added to them)."""
    folder: str | None = None
    """A combo over the model files of this folder."""
    choices: tuple[str, ...] = ()
    """A combo over fixed values."""
    vaes: bool = False
    """A combo over `vae_list`."""
    required: bool = True
    api: Api = Api.V1
    listed: bool = True
    """A V1 COMBO declared as its values; False: declared as the type name COMBO with
    options (LoadImageOutput's image), which validation does not check."""

    @property
    def is_link(self) -> bool:
        return self.type not in (*PRIMITIVES, "COMBO")

    @property
    def is_list(self) -> bool:
        """Declared as a list of values: validation refuses a value not in it.

        A V3 `io.Combo` is declared as the type name COMBO with the values among its
        options, which ComfyUI 0.3.64's validation does not check.
        """
        return self.type == "COMBO" and self.api is Api.V1 and self.listed

    def combo(self, files: Mapping[str, list[str]]) -> list[str]:
        """The values a combo offers."""
        if self.vaes:
            return vae_list(files)
        return list(files.get(self.folder, [])) if self.folder else list(self.choices)

    def info(self, files: Mapping[str, list[str]]) -> list[Any]:
        """`(input_type, extra_info)` as validation echoes it in `input_config`."""
        if self.is_list:
            return [self.combo(files), dict(self.options)]
        if self.type == "COMBO" and not self.listed:
            return ["COMBO", dict(self.options)]
        if self.type == "COMBO":
            # Combo.Input.as_dict: `multiselect` and `options` after the widget's own keys.
            return ["COMBO", {**self.options, "multiselect": False, "options": self.combo(files)}]
        return [self.type, dict(self.options)]

    def config(self, files: Mapping[str, list[str]]) -> list[Any]:
        """The input as declared: `[type or values]`, with `{options}` when there are any
        (a V3 input always has its options, even empty)."""
        head, options = self.info(files)
        return [head, options] if options or self.api is Api.V3 else [head]


@attrs.frozen
class Validate:
    """A class's own `VALIDATE_INPUTS(s, *args)`: ComfyUI passes it the named inputs'
    values and skips their min, max and value-list checks."""

    args: tuple[str, ...]
    judge: Callable[[Mapping[str, Any], Callable[[str], bool]], bool | str]
    """The values by name, and `exists_annotated_filepath`: True, False or a message."""
    function: str
    """Its qualified name, as Python's TypeError names it."""


@attrs.frozen
class NodeDef:
    """One node class: what it does and how `/object_info` describes it."""

    class_type: str
    work: Work
    inputs: tuple[InputDef, ...]
    outputs: tuple[str, ...]
    category: str
    display_name: str | None = None
    """NODE_DISPLAY_NAME_MAPPINGS (V1: the class name when absent) or the schema's (V3)."""
    description: str = ""
    output_tooltips: tuple[str | None, ...] | None = None
    output_node: bool = False
    deprecated: bool = False
    experimental: bool = False
    hidden: tuple[tuple[str, str], ...] = ()
    """Hidden inputs (never validated): name and kind, such as ("prompt", "PROMPT")."""
    api: Api = Api.V1
    python_module: str = "nodes"
    folder: str | None = None
    """Where LOAD_FILE finds its file."""
    role: str = ""
    """What LOAD_FILE produces: the role of its weights (model, clip, vae, ...)."""
    validate: Validate | None = None

    def input(self, name: str) -> InputDef | None:
        return next((i for i in self.inputs if i.name == name), None)
