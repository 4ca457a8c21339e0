"""What each node does when it runs: values passed along links, VRAM, time, files."""

from __future__ import annotations

import asyncio
import os
import random
import string
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

import attrs

from gpugate.core.units import GiB
from gpugate_sim.comfyui.images import solid_png
from gpugate_sim.comfyui.memory import Part, Vram
from gpugate_sim.comfyui.nodes import PIXEL_SPACE, TAESD, NodeDef, Work
from gpugate_sim.scenario import ComfyUISpec

CHECKPOINT_SHARES = (("model", 0.80), ("clip", 0.12))
"""How a checkpoint file divides into UNet, text encoder and (the rest) VAE weights."""
UPSCALE_FACTOR = 4


@attrs.frozen
class Weights:
    """MODEL, CLIP, VAE, CONTROL_NET, UPSCALE_MODEL: weights not yet on the GPU."""

    parts: tuple[Part, ...]

    def __str__(self) -> str:
        return f"<comfy.model_patcher.ModelPatcher object at {id(self):#x}>"


@attrs.frozen
class Conditioning:
    parts: tuple[Part, ...] = ()
    """Control nets the sampler loads along with the model."""


@attrs.frozen
class Latent:
    width: int
    height: int
    batch: int
    seed: int = 0


@attrs.frozen
class Images:
    width: int
    height: int
    batch: int
    color: int


Ui = dict[str, Any]


@attrs.define
class NodeRun:
    """One node's execution: its resolved inputs and what it may use."""

    node_id: str
    node: NodeDef
    inputs: dict[str, Any]
    prompt: dict[str, Any]
    extra_data: dict[str, Any]
    spec: ComfyUISpec
    vram: Vram
    files: Mapping[tuple[str, str], int]
    output_dir: Path
    temp_dir: Path
    step: Callable[[int, int], Awaitable[None]]
    """The sampler's per-step hook: interrupt check, progress, preview."""
    input_dir: Path | None = None

    async def busy(self) -> None:
        if self.spec.node_seconds > 0:
            await asyncio.sleep(self.spec.node_seconds)

    def size(self, folder: str, name: Any) -> int:
        """folder_paths `get_full_path_or_raise`: the size of the file `name` is, or raise."""
        size = self.files.get((folder, file_name(name)))
        if size is None:
            raise FileNotFoundError(f"Model in folder '{folder}' with filename '{name}' not found.")
        return size

    def part(self, folder: str, name: Any, role: str, share: float = 1.0) -> Part:
        return Part(folder, file_name(name), role, int(self.size(folder, name) * share))


def file_name(name: Any) -> str:
    """folder_paths `get_full_path`'s normalization of a name (TypeError if not a string).

    It matters for a V3 combo (UpscaleModelLoader), whose value validation does not check:
    `x/../4x.pth` loads `4x.pth`.
    """
    return os.path.relpath(os.path.join("/", name), "/")


async def run(node: NodeRun) -> tuple[tuple[Any, ...], Ui | None]:
    """Run a node; returns its output values and its UI output (None if it has none)."""
    await node.busy()
    return await _WORK[node.node.work](node)


async def _load_checkpoint(n: NodeRun) -> tuple[tuple[Any, ...], None]:
    name = n.inputs["ckpt_name"]
    size = n.size("checkpoints", name)
    parts = [
        Part("checkpoints", name, role, int(size * share)) for role, share in CHECKPOINT_SHARES
    ]
    parts.append(Part("checkpoints", name, "vae", size - sum(p.size for p in parts)))
    return tuple(Weights((p,)) for p in parts), None


async def _load_file(n: NodeRun) -> tuple[tuple[Any, ...], None]:
    folder = n.node.folder
    assert folder is not None
    name = n.inputs[n.node.inputs[0].name]
    return (Weights((n.part(folder, name, n.node.role),)),), None


async def _load_vae(n: NodeRun) -> tuple[tuple[Any, ...], None]:
    """VAELoader.load_vae: pixel_space has no weights; a tiny autoencoder is its encoder and
    decoder files from vae_approx, one model; anything else a file of the vae folder."""
    name = n.inputs["vae_name"]
    if name == PIXEL_SPACE:
        return (Weights(()),), None
    for taesd, encoder, decoder in TAESD:
        if name == taesd:
            approx = sorted(f for folder, f in n.files if folder == "vae_approx")
            pair = [next(f for f in approx if f.startswith(p)) for p in (encoder, decoder)]
            size = sum(n.size("vae_approx", f) for f in pair)
            return (Weights((Part("vae_approx", "+".join(pair), "vae", size),)),), None
    return (Weights((n.part("vae", name, "vae"),)),), None


async def _load_dual_clip(n: NodeRun) -> tuple[tuple[Any, ...], None]:
    # One CLIP object holding both encoders: it is loaded and unloaded as one model.
    names = (n.inputs["clip_name1"], n.inputs["clip_name2"])
    size = sum(n.size("text_encoders", name) for name in names)
    return (Weights((Part("text_encoders", "+".join(names), "clip", size),)),), None


async def _load_lora(n: NodeRun) -> tuple[tuple[Any, ...], None]:
    model, clip = n.inputs["model"], n.inputs["clip"]
    if n.inputs["strength_model"] == 0 and n.inputs["strength_clip"] == 0:
        # LoraLoader.load_lora returns its inputs before it opens the file.
        return (model, clip), None
    lora = n.part("loras", n.inputs["lora_name"], "lora")
    return (Weights((*model.parts, lora)), clip), None


async def _encode_text(n: NodeRun) -> tuple[tuple[Any, ...], None]:
    await n.vram.load(n.inputs["clip"].parts)
    return (Conditioning(),), None


async def _guidance(n: NodeRun) -> tuple[tuple[Any, ...], None]:
    return (n.inputs["conditioning"],), None


async def _apply_controlnet(n: NodeRun) -> tuple[tuple[Any, ...], None]:
    parts = (*n.inputs["conditioning"].parts, *n.inputs["control_net"].parts)
    return (Conditioning(parts),), None


async def _empty_latent(n: NodeRun) -> tuple[tuple[Any, ...], None]:
    return (Latent(n.inputs["width"], n.inputs["height"], n.inputs["batch_size"]),), None


async def _sample(n: NodeRun) -> tuple[tuple[Any, ...], None]:
    latent: Latent = n.inputs["latent_image"]
    parts = (*n.inputs["model"].parts, *n.inputs["positive"].parts, *n.inputs["negative"].parts)
    pixels = latent.width * latent.height * latent.batch
    working = int(n.spec.sampler_bytes_per_megapixel * pixels / (1 << 20))
    # sampler_helpers.prepare_sampling: the model's estimate of its working set is both
    # what load_models_gpu keeps free and its minimum.
    await n.vram.load(parts, memory_required=working, minimum_memory_required=working)
    steps = n.inputs["steps"]
    async with n.vram.working_set(working, keep=set(parts)):
        for step in range(1, steps + 1):
            await asyncio.sleep(step_seconds(n.spec, n.vram.offloaded(parts)))
            await n.step(step, steps)
            n.vram.pressure(set(parts))
    return (attrs.evolve(latent, seed=n.inputs["seed"]),), None


def step_seconds(spec: ComfyUISpec, offloaded: int) -> float:
    """One sampler step: `1/steps_per_second`, plus, for a model partly in CPU RAM, the
    copy of its offloaded weights to the GPU that every step makes (comfy/ops.py
    `cast_bias_weight` on each lowvram module's forward) at `offload_gib_per_second`."""
    return 1.0 / spec.steps_per_second + offloaded / GiB / spec.offload_gib_per_second


async def _decode(n: NodeRun) -> tuple[tuple[Any, ...], None]:
    await n.vram.load(n.inputs["vae"].parts)
    latent: Latent = n.inputs["samples"]
    color = random.Random(latent.seed).randrange(0x1000000)
    return (Images(latent.width, latent.height, latent.batch, color),), None


async def _upscale(n: NodeRun) -> tuple[tuple[Any, ...], None]:
    await n.vram.load(n.inputs["upscale_model"].parts)
    image: Images = n.inputs["image"]
    bigger = attrs.evolve(
        image, width=image.width * UPSCALE_FACTOR, height=image.height * UPSCALE_FACTOR
    )
    return (bigger,), None


async def _empty_image(n: NodeRun) -> tuple[tuple[Any, ...], None]:
    i = n.inputs
    return (Images(i["width"], i["height"], i["batch_size"], i["color"]),), None


async def _load_image(n: NodeRun) -> tuple[tuple[Any, ...], None]:
    # folder_paths.get_annotated_filepath, then PIL's open: a directory fails here.
    name: str = n.inputs["image"]
    base = n.input_dir or n.output_dir.parent / "input"
    for folder, root in (("output", n.output_dir), ("input", base), ("temp", n.temp_dir)):
        if name.endswith(f"[{folder}]"):
            name, base = name[: -(len(folder) + 3)], root
            break
    path = os.path.join(base, name)
    if os.path.isdir(path):
        raise IsADirectoryError(f"[Errno 21] Is a directory: '{path}'")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"[Errno 2] No such file or directory: '{path}'")
    image = Images(64, 64, 1, 0x808080)
    return ((image,) if n.node.class_type == "LoadImageMask" else (image, image)), None


async def _pass_image(n: NodeRun) -> tuple[tuple[Any, ...], None]:
    return (next(v for v in n.inputs.values() if isinstance(v, Images)),), None


async def _encode_image(n: NodeRun) -> tuple[tuple[Any, ...], None]:
    await n.vram.load(n.inputs["vae"].parts)
    image: Images = n.inputs["pixels"]
    return (Latent(image.width, image.height, image.batch),), None


async def _save_image(n: NodeRun) -> tuple[tuple[Any, ...], Ui]:
    prefix = n.inputs.get("filename_prefix", "ComfyUI")
    return (), {"images": _save(n, n.output_dir, prefix, "output")}


async def _preview_image(n: NodeRun) -> tuple[tuple[Any, ...], Ui]:
    suffix = "".join(random.choice(string.ascii_lowercase) for _ in range(5))
    return (), {"images": _save(n, n.temp_dir, "ComfyUI_temp_" + suffix, "temp")}


def _save(n: NodeRun, root: Path, prefix: str, kind: str) -> list[dict[str, str]]:
    """SaveImage: `prefix_00001_.png` onwards, numbered after what the folder holds."""
    images: Images = n.inputs["images"]
    prefix = prefix.replace("%width%", str(images.width)).replace("%height%", str(images.height))
    subfolder = os.path.dirname(os.path.normpath(prefix))
    filename = os.path.basename(os.path.normpath(prefix))
    folder = root / subfolder
    if os.path.commonpath((str(root), os.path.abspath(folder))) != str(root):
        raise Exception(
            "**** ERROR: Saving image outside the output folder is not allowed.\n"
            f" full_output_folder: {os.path.abspath(folder)}\n"
            f"         output_dir: {root}\n"
            f"         commonpath: {os.path.commonpath((str(root), os.path.abspath(folder)))}"
        )
    folder.mkdir(parents=True, exist_ok=True)
    counter = _next_counter(folder, filename)
    text: dict[str, object] = {"prompt": n.prompt}
    text.update(n.extra_data.get("extra_pnginfo") or {})
    results = []
    for batch_number in range(images.batch):
        name = f"{filename.replace('%batch_num%', str(batch_number))}_{counter:05}_.png"
        data = solid_png(images.width, images.height, images.color, text)
        (folder / name).write_bytes(data)
        results.append({"filename": name, "subfolder": subfolder, "type": kind})
        counter += 1
    return results


def _next_counter(folder: Path, filename: str) -> int:
    best = 0
    for entry in os.listdir(folder):
        prefix = entry[: len(filename) + 1]
        if prefix[:-1] != filename or prefix[-1:] != "_":
            continue
        try:
            best = max(best, int(entry[len(filename) + 1 :].split("_")[0]))
        except ValueError:
            continue
    return best + 1


_WORK: dict[Work, Callable[[NodeRun], Awaitable[tuple[tuple[Any, ...], Any]]]] = {
    Work.LOAD_CHECKPOINT: _load_checkpoint,
    Work.LOAD_FILE: _load_file,
    Work.LOAD_VAE: _load_vae,
    Work.LOAD_DUAL_CLIP: _load_dual_clip,
    Work.LOAD_LORA: _load_lora,
    Work.ENCODE_TEXT: _encode_text,
    Work.GUIDANCE: _guidance,
    Work.APPLY_CONTROLNET: _apply_controlnet,
    Work.EMPTY_LATENT: _empty_latent,
    Work.SAMPLE: _sample,
    Work.DECODE: _decode,
    Work.UPSCALE: _upscale,
    Work.EMPTY_IMAGE: _empty_image,
    Work.SAVE_IMAGE: _save_image,
    Work.PREVIEW_IMAGE: _preview_image,
    Work.LOAD_IMAGE: _load_image,
    Work.PASS_IMAGE: _pass_image,
    Work.ENCODE_IMAGE: _encode_image,
}
