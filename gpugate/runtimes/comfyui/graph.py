"""Reading a ComfyUI `POST /prompt` body: which model files the prompt loads, how big it samples.

Pure: bytes in, a `PromptDemand` or an `Unreadable` out, never an exception.

What ComfyUI itself would refuse before queueing, for reasons of shape rather than of nodes,
is `Unreadable`, and the gate passes it up unleased so that ComfyUI answers its own error: a
body that is not UTF-8 JSON, not an object, without `prompt`, a `prompt` that is not an object,
a node that is not an object or has no string `class_type`, a `number` that `float()` refuses,
`partial_execution_targets` that `in` cannot search, or a graph with no output to run.

Which nodes count: ComfyUI runs only the output nodes (and the nodes they link to, following
`[node_id, slot]` links as `comfy_execution.graph_utils.is_link` reads them), so a loader left in
a graph but feeding no output loads nothing and is not counted. A node of a class not in
`KNOWN_NODES` may be a custom output node (a video saver), so it is taken as an output:
what it links to counts. Inputs that are not links, and links to nodes that do not exist, are
ignored (ComfyUI answers for those after validation; the adapter releases on a refusal).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Mapping
from typing import Any

import attrs

from gpugate.config.filesizes import canonical_folder

LOADERS: dict[str, tuple[tuple[str, str], ...]] = {
    "CheckpointLoaderSimple": (("ckpt_name", "checkpoints"),),
    "CheckpointLoader": (("ckpt_name", "checkpoints"),),
    "unCLIPCheckpointLoader": (("ckpt_name", "checkpoints"),),
    "ImageOnlyCheckpointLoader": (("ckpt_name", "checkpoints"),),
    "UNETLoader": (("unet_name", "diffusion_models"),),
    "CLIPLoader": (("clip_name", "text_encoders"),),
    "DualCLIPLoader": (("clip_name1", "text_encoders"), ("clip_name2", "text_encoders")),
    "TripleCLIPLoader": tuple((f"clip_name{n}", "text_encoders") for n in (1, 2, 3)),
    "QuadrupleCLIPLoader": tuple((f"clip_name{n}", "text_encoders") for n in (1, 2, 3, 4)),
    "VAELoader": (("vae_name", "vae"),),
    "LoraLoader": (("lora_name", "loras"),),
    "LoraLoaderModelOnly": (("lora_name", "loras"),),
    "ControlNetLoader": (("control_net_name", "controlnet"),),
    "DiffControlNetLoader": (("control_net_name", "controlnet"),),
    "UpscaleModelLoader": (("model_name", "upscale_models"),),
    "CLIPVisionLoader": (("clip_name", "clip_vision"),),
    "StyleModelLoader": (("style_model_name", "style_models"),),
    "GLIGENLoader": (("gligen_name", "gligen"),),
    "HypernetworkLoader": (("hypernetwork_name", "hypernetworks"),),
}
"""Loader node class -> (input naming a file, the model folder it is read from)."""

LATENTS = frozenset({"EmptyLatentImage", "EmptySD3LatentImage"})
"""Nodes whose width x height x batch_size is a latent the sampler works on."""

TAESD_VAES = frozenset({"taesd", "taesdxl", "taesd3", "taef1", "pixel_space"})
"""`VAELoader` names that are not files of `vae` but small decoders of `vae_approx`."""

OUTPUTS = frozenset(
    {
        "SaveImage", "PreviewImage", "SaveAnimatedWEBP", "SaveAnimatedPNG", "SaveLatent",
        "SaveVideo", "SaveWEBM", "SaveAudio", "PreviewAudio", "SaveGLB",
    }
)  # fmt: skip
"""ComfyUI's own output nodes (`OUTPUT_NODE = True`)."""

KNOWN_NODES = OUTPUTS | LOADERS.keys() | LATENTS | frozenset(
    {
        "CLIPTextEncode", "CLIPSetLastLayer", "FluxGuidance", "ControlNetApply",
        "ControlNetApplyAdvanced", "KSampler", "KSamplerAdvanced", "SamplerCustom",
        "SamplerCustomAdvanced", "BasicGuider", "CFGGuider", "BasicScheduler", "KSamplerSelect",
        "RandomNoise", "ModelSamplingFlux", "ModelSamplingSD3", "VAEDecode", "VAEEncode",
        "VAEDecodeTiled", "VAEEncodeForInpaint", "ImageUpscaleWithModel", "ImageScale",
        "ImageScaleBy", "LatentUpscale", "LatentUpscaleBy", "EmptyImage", "LoadImage",
        "LoadImageMask", "ConditioningCombine", "ConditioningSetArea", "ConditioningZeroOut",
        "CLIPVisionEncode", "StyleModelApply", "unCLIPConditioning", "InpaintModelConditioning",
        "SetLatentNoiseMask", "RepeatLatentBatch", "ImageInvert", "ImageBatch",
    }
)  # fmt: skip
"""Node classes the gate knows; a class not among them is taken as a possible output."""
NOT_OUTPUTS = KNOWN_NODES - OUTPUTS

MEGAPIXEL = 1 << 20
"""Pixels in a megapixel: 1024 x 1024."""
NO_FILES_KEY = "(no model files)"
"""The file-set key of a prompt that loads no model file."""
KEY_MAX = 160
"""A longer file-set key is shortened to its first file, a count and a hash."""


@attrs.frozen
class ModelFile:
    """A model file a prompt loads: its folder (as ComfyUI names it today) and its name."""

    folder: str
    name: str | None
    """None when the graph does not write it (a link from another node gives it)."""

    def __str__(self) -> str:
        return f"{self.folder}/{self.name if self.name is not None else '?'}"

    def sort_key(self) -> tuple[str, bool, str]:
        return (self.folder, self.name is None, self.name or "")


DEEPEST = 900
"""The deepest nesting read: CPython's json.loads recurses once per level and fails at the
interpreter's recursion limit (1,000 frames) less the frames already on the stack, which
differ between ComfyUI's handler and the gate. Below this both read a body the same way;
above it the gate cannot say whether ComfyUI will."""

_TOKENS = re.compile(r'"(?:[^"\\]|\\.)*"|[\[\]{}]')


def nesting(text: str) -> int:
    """How deep arrays and objects nest in a JSON text (strings skipped), without recursion."""
    if text.count("[") + text.count("{") <= DEEPEST:
        return 0  # too few brackets to nest deeper than the bound
    depth = deepest = 0
    for match in _TOKENS.finditer(text):
        token = match.group()
        if token in ("[", "{"):
            depth += 1
            deepest = max(deepest, depth)
        elif token in ("]", "}"):
            depth -= 1
    return deepest


@attrs.frozen
class TooDeep:
    """A body nested past `DEEPEST`: whether ComfyUI reads it depends on its own stack, so
    the gate refuses it as ComfyUI refuses one it cannot read (a 500)."""


@attrs.frozen
class Unreadable:
    """A body ComfyUI refuses on its own; forward it unleased and let ComfyUI answer."""

    reason: str


@attrs.frozen
class PromptDemand:
    """What one readable `POST /prompt` asks of the GPU."""

    files: tuple[ModelFile, ...]
    """Every model file the prompt's outputs need, each once, sorted."""
    megapixels: float
    """The largest empty latent the outputs need, in megapixels (x batch size); 0 if none."""
    key: str
    """The file set as one stable, order-independent string: the lease key's model half."""
    outputs: tuple[str, ...]
    """Node ids taken as outputs (ComfyUI's own, or of classes the gate does not know)."""
    prompt_id: str | None = None
    """As ComfyUI will name the job (`str()` of the body's `prompt_id`); None: ComfyUI picks."""
    client_id: str | None = None
    """The websocket client the job's events go to, when the body names one."""
    number: float | None = None
    """The body's queue `number`, when it gives one."""
    front: bool = False
    """Whether the body asks to run next (`front`, when no `number` is given)."""
    prompt: Mapping[str, Any] = attrs.field(factory=dict, eq=False, repr=False)
    """The graph as ComfyUI will read it, for its validation."""
    targets: Any = attrs.field(default=None, eq=False, repr=False)
    """The body's `partial_execution_targets`, as it gave them."""

    @property
    def unnamed(self) -> tuple[ModelFile, ...]:
        """Files whose name the graph does not write, so no size can be looked up."""
        return tuple(f for f in self.files if f.name is None)


def files_key(files: Iterable[ModelFile]) -> str:
    """A stable key of a file set: names joined by '+', sorted; hashed when long."""
    unique = sorted(set(files), key=ModelFile.sort_key)
    if not unique:
        return NO_FILES_KEY
    names = sorted(f.name if f.name is not None else f"<{f.folder}>" for f in unique)
    key = "+".join(names)
    if len(key) <= KEY_MAX:
        return key
    # The hash covers the folders too, so two long sets never share a key by a folder.
    digest = hashlib.sha256("\n".join(str(f) for f in unique).encode()).hexdigest()[:16]
    short = f"{names[0]}+{len(names) - 1} more#{digest}"
    return short if len(short) <= KEY_MAX else f"{len(names)} files#{digest}"


def _is_link(value: object) -> bool:
    """`comfy_execution.graph_utils.is_link`."""
    return (
        isinstance(value, list)
        and len(value) == 2
        and isinstance(value[0], str)
        and isinstance(value[1], (int, float))
    )


def _whole(value: object) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        return None
    return value


def _latent_megapixels(inputs: Mapping[str, Any]) -> float:
    width, height = _whole(inputs.get("width")), _whole(inputs.get("height"))
    batch = _whole(inputs.get("batch_size", 1))
    if width is None or height is None or batch is None:
        return 0.0
    return width * height * batch / MEGAPIXEL


def _loaded_files(class_type: str, inputs: Mapping[str, Any]) -> list[ModelFile]:
    files = []
    for input_name, folder in LOADERS.get(class_type, ()):
        if input_name not in inputs:
            continue
        value = inputs[input_name]
        name = value if isinstance(value, str) else None
        if folder == "vae" and name in TAESD_VAES:
            folder = "vae_approx"
        files.append(ModelFile(canonical_folder(folder), name))
    return files


def _parse_body(body: bytes, charset: str | None) -> dict[str, Any] | Unreadable | TooDeep:
    # aiohttp's request.json(): the text in the Content-Type's charset (UTF-8 by default),
    # strictly, then json.loads.
    try:
        text = body.decode(charset or "utf-8")
    except (LookupError, UnicodeDecodeError):
        return Unreadable(f"the body is not {charset or 'UTF-8'} text")
    if nesting(text) > DEEPEST:
        return TooDeep()
    try:
        data = json.loads(text)
    except RecursionError:
        return TooDeep()
    except ValueError:
        return Unreadable("the body is not JSON")
    if not isinstance(data, dict):
        return Unreadable("the body is not a JSON object")
    return data


def read_prompt(body: bytes, charset: str | None = None) -> PromptDemand | Unreadable | TooDeep:
    """The demand of a `POST /prompt` body (in the Content-Type's `charset`), or why ComfyUI
    will refuse it itself, or that the gate cannot tell whether ComfyUI can read it."""
    data = _parse_body(body, charset)
    if isinstance(data, (Unreadable, TooDeep)):
        return data
    number: float | None = None
    if "number" in data:
        try:
            number = float(data["number"])
        except (TypeError, ValueError, OverflowError):
            return Unreadable("number is not a number")
    if "prompt" not in data:
        return Unreadable("no prompt")
    prompt = data["prompt"]
    if not isinstance(prompt, dict):
        return Unreadable("prompt is not an object")
    for node_id, node in prompt.items():
        if not isinstance(node, dict) or not isinstance(node.get("class_type"), str):
            return Unreadable(f"node {node_id!r} has no class_type")
    outputs = [i for i, node in prompt.items() if node["class_type"] not in NOT_OUTPUTS]
    targets = data.get("partial_execution_targets")
    if targets is not None:
        try:
            outputs = [i for i in outputs if i in targets]
        except TypeError:
            return Unreadable("partial_execution_targets is not a list")
    if not outputs:
        return Unreadable("the prompt has no outputs")
    files, megapixels = _needed(prompt, outputs)
    client_id = data.get("client_id")
    return PromptDemand(
        files=files,
        megapixels=megapixels,
        key=files_key(files),
        outputs=tuple(outputs),
        prompt_id=str(data["prompt_id"]) if "prompt_id" in data else None,
        client_id=client_id if isinstance(client_id, str) else None,
        number=number,
        front=number is None and bool(data.get("front")),
        prompt=prompt,
        targets=targets,
    )


def _needed(
    prompt: Mapping[str, Mapping[str, Any]], outputs: list[str]
) -> tuple[tuple[ModelFile, ...], float]:
    """The files and largest latent of every node the outputs need, links followed."""
    seen: set[str] = set()
    stack = list(outputs)
    files: set[ModelFile] = set()
    megapixels = 0.0
    while stack:
        node_id = stack.pop()
        if node_id in seen or node_id not in prompt:
            continue
        seen.add(node_id)
        node = prompt[node_id]
        inputs = node.get("inputs")
        if not isinstance(inputs, dict):
            continue
        class_type = node["class_type"]
        if class_type in LOADERS:
            files.update(_loaded_files(class_type, inputs))
        elif class_type in LATENTS:
            megapixels = max(megapixels, _latent_megapixels(inputs))
        for value in inputs.values():
            # a literal (most inputs) is passed over before the call
            if isinstance(value, list) and _is_link(value):
                stack.append(value[0])
    return tuple(sorted(files, key=ModelFile.sort_key)), megapixels
