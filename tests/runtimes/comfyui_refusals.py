"""Prompts ComfyUI 0.3.64 refuses that the gate leaves, wholly or in part, to ComfyUI's own
judgment: files the LoadImage family names that ComfyUI does not have, custom nodes whose
VALIDATE_INPUTS refuses, cycles, bad values behind nodes the gate cannot judge, and the
exceptions the file checks raise. Most would load a checkpoint: a lease of GiBs.

Each prompt runs against a ComfyUI whose input folder holds `example.png`, `sub/in-sub.png`
and a directory `dir.png`, whose output folder holds `made.png`, with the checkpoint SD15
and the custom node pack `checked_nodes` (gpugate.sim.comfyui.custom_pack). ComfyUI's
answers to them are in comfyui_refusals.json, recorded from ComfyUI 0.3.64 itself
(record_comfyui_refusals.py).
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

SD15 = "v1-5-pruned-emaonly-fp16.safetensors"
ANSWERS = Path(__file__).with_name("comfyui_refusals.json")

Prompt = dict[str, Any]

ORDER_DEPENDENT = frozenset(
    {
        "KSampler samples its own latent", "img2img encodes its own decode",
        "cycle beside a converted literal", "a cycle and a missing file",
        "two outputs, two missing files", "two outputs, each on a cycle",
        "cycle ImageInvert-ImageSizeCheck with two outputs",
        "cycle ImageSizeCheck-ImageSizeCheck with two outputs",
    }
)  # fmt: skip
"""Prompts whose refusal's body depends on the order ComfyUI iterates a set in (its string
hashing, random per process): which outputs it validates first (`validated` is shared, so
a node failed for one output is listed again for each later one), and which of a cycle
node's links it follows first (a node first validated where the recursion runs out keeps
a RecursionError reason). The status and error type do not depend on it."""

MISSING_NAMES = (
    "nope.png", "photo 1.png", "x.jpg", "sub/missing.png", "missing.png [input]",
    "missing.png [output]", "missing.png [temp]", "example.png [output]", "made.png",
    "in-sub.png", "EXAMPLE.PNG", "example.png ", "example", "ex ample.png", "画像.png",
    "sub/example.png", "example.png[input]", "./nope.png", "sub/dir.png/x.png", "made.png[output]",
)  # fmt: skip
"""Names ComfyUI's `exists_annotated_filepath` does not find (each for its own reason)."""
OUTPUT_MISSING = (
    "nope.png", "made.png", "nope.png [output]", "made.png [input]", "made.png [temp]",
    "sub/made.png [output]", "example.png [output]", "made", "made.png  [output]",
    "Made.png [output]", "made.png [outputs]", "x/../nope.png",
)  # fmt: skip
SCALE_ERRORS = (
    {"upscale_method": "magic"}, {"crop": "diagonal"}, {"width": 99999}, {"height": -1},
    {"width": "wide"},
)  # fmt: skip
"""ImageScale inputs the gate itself refuses."""


def load_image(name: Any, cls: str = "LoadImage") -> dict[str, Any]:
    return {"class_type": cls, "inputs": {"image": name}}


def scale(image: list[Any], **change: Any) -> dict[str, Any]:
    inputs = {"image": image, "upscale_method": "bilinear", "width": 512, "height": 512,
              "crop": "disabled"}  # fmt: skip
    inputs.update(change)
    return {"class_type": "ImageScale", "inputs": inputs}


def img2img(source: dict[str, Any], *between: dict[str, Any]) -> Prompt:
    """A checkpoint samples from the image `source` loads (through `between`, in order)."""
    prompt: Prompt = {
        "4": {"class_type": "CheckpointLoaderSimple", "inputs": {"ckpt_name": SD15}},
        "6": {"class_type": "CLIPTextEncode", "inputs": {"text": "a cat", "clip": ["4", 1]}},
        "7": {"class_type": "CLIPTextEncode", "inputs": {"text": "", "clip": ["4", 1]}},
        "10": source,
    }
    last = "10"
    for n, node in enumerate(between, start=20):
        node = copy.deepcopy(node)
        first = next(k for k, v in node["inputs"].items() if v == ["?", 0])
        node["inputs"][first] = [last, 0]
        prompt[str(n)] = node
        last = str(n)
    prompt["11"] = {"class_type": "VAEEncode", "inputs": {"pixels": [last, 0], "vae": ["4", 2]}}
    prompt["3"] = {"class_type": "KSampler", "inputs": {
        "seed": 1, "steps": 20, "cfg": 8.0, "sampler_name": "euler", "scheduler": "normal",
        "denoise": 0.75, "model": ["4", 0], "positive": ["6", 0], "negative": ["7", 0],
        "latent_image": ["11", 0]}}  # fmt: skip
    prompt["8"] = {"class_type": "VAEDecode", "inputs": {"samples": ["3", 0], "vae": ["4", 2]}}
    prompt["9"] = {
        "class_type": "SaveImage",
        "inputs": {"filename_prefix": "x", "images": ["8", 0]},
    }
    return prompt


def preview(
    source: dict[str, Any], *between: dict[str, Any], saver: str = "PreviewImage"
) -> Prompt:
    prompt: Prompt = {"1": source}
    last = "1"
    for n, node in enumerate(between, start=2):
        node = copy.deepcopy(node)
        first = next(k for k, v in node["inputs"].items() if v == ["?", 0])
        node["inputs"][first] = [last, 0]
        prompt[str(n)] = node
        last = str(n)
    inputs: dict[str, Any] = {"images": [last, 0]}
    if saver != "PreviewImage":
        inputs["filename_prefix"] = "x"
    prompt["9"] = {"class_type": saver, "inputs": inputs}
    return prompt


def txt2img(
    positive: str = "CLIPTextEncode",
    negative: str = "CLIPTextEncode",
    *,
    positive_text: str = "a cat",
    negative_text: str = "",
) -> Prompt:
    prompt = img2img(load_image("example.png"))
    del prompt["10"]
    prompt["5"] = {
        "class_type": "EmptyLatentImage",
        "inputs": {"width": 512, "height": 512, "batch_size": 1},
    }
    prompt["11"] = prompt.pop("5")
    prompt["6"]["class_type"] = positive
    prompt["7"]["class_type"] = negative
    prompt["6"]["inputs"]["text"] = positive_text
    prompt["7"]["inputs"]["text"] = negative_text
    return prompt


def size_check(multiple: Any = 8) -> dict[str, Any]:
    return {"class_type": "ImageSizeCheck", "inputs": {"image": ["?", 0], "multiple": multiple}}


def invert() -> dict[str, Any]:
    return {"class_type": "ImageInvert", "inputs": {"image": ["?", 0]}}


def scaled(**change: Any) -> dict[str, Any]:
    return scale(["?", 0], **change)


def cycles() -> list[tuple[str, Prompt]]:
    out: list[tuple[str, Prompt]] = []
    pair = {
        "1": {"class_type": "ImageInvert", "inputs": {"image": ["2", 0]}},
        "2": {"class_type": "ImageInvert", "inputs": {"image": ["1", 0]}},
        "3": {"class_type": "PreviewImage", "inputs": {"images": ["1", 0]}},
    }
    out.append(("cycle of two", pair))
    self_loop = {
        "1": {"class_type": "ImageInvert", "inputs": {"image": ["1", 0]}},
        "3": {"class_type": "PreviewImage", "inputs": {"images": ["1", 0]}},
    }
    out.append(("cycle of one", self_loop))
    for length in (3, 4, 7, 12):
        ring = {
            str(n): {"class_type": "ImageInvert", "inputs": {"image": [str((n + 1) % length), 0]}}
            for n in range(length)
        }
        ring["out"] = {"class_type": "PreviewImage", "inputs": {"images": ["0", 0]}}
        out.append((f"cycle of {length}", ring))
    for change in SCALE_ERRORS[:3]:
        ring = {
            "1": scale(["2", 0], **change),
            "2": {"class_type": "ImageInvert", "inputs": {"image": ["1", 0]}},
            "3": {"class_type": "PreviewImage", "inputs": {"images": ["2", 0]}},
        }
        out.append((f"cycle with ImageScale {change}", ring))
    through_custom = {
        "1": {"class_type": "ImageSizeCheck", "inputs": {"image": ["2", 0], "multiple": 8}},
        "2": {"class_type": "ImageInvert", "inputs": {"image": ["1", 0]}},
        "3": {"class_type": "PreviewImage", "inputs": {"images": ["2", 0]}},
    }
    out.append(("cycle through a custom node", through_custom))
    bad_custom = copy.deepcopy(through_custom)
    bad_custom["1"]["inputs"]["multiple"] = 3
    out.append(("cycle through a refusing custom node", bad_custom))
    sampler_loop = txt2img()
    sampler_loop["3"]["inputs"]["latent_image"] = ["3", 0]
    out.append(("KSampler samples its own latent", sampler_loop))
    decode_loop = img2img(load_image("example.png"))
    decode_loop["11"]["inputs"]["pixels"] = ["8", 0]
    out.append(("img2img encodes its own decode", decode_loop))
    both = img2img(load_image("example.png"))
    both["11"]["inputs"]["pixels"] = ["8", 0]
    both["6"]["inputs"]["text"] = 5
    out.append(("cycle beside a converted literal", both))
    for a, b in (("ImageInvert", "ImageSizeCheck"), ("ImageSizeCheck", "ImageSizeCheck")):
        ring = {
            "1": {"class_type": a, "inputs": {"image": ["2", 0]}},
            "2": {"class_type": b, "inputs": {"image": ["1", 0]}},
            "5": load_image("example.png"),
            "3": {"class_type": "PreviewImage", "inputs": {"images": ["2", 0]}},
            "4": {"class_type": "PreviewImage", "inputs": {"images": ["1", 0]}},
        }
        for node in ("1", "2"):
            if ring[node]["class_type"] == "ImageSizeCheck":
                ring[node]["inputs"]["multiple"] = 16
        out.append((f"cycle {a}-{b} with two outputs", ring))
    long_tail = {"0": load_image("example.png")}
    for n in range(1, 30):
        long_tail[str(n)] = {"class_type": "ImageInvert", "inputs": {"image": [str(n - 1), 0]}}
    long_tail["1"]["inputs"]["image"] = ["29", 0]
    long_tail["out"] = {"class_type": "PreviewImage", "inputs": {"images": ["15", 0]}}
    out.append(("cycle of 29 behind a preview", long_tail))
    two_cycles = copy.deepcopy(pair)
    two_cycles.update(
        {
            "4": {"class_type": "ImageInvert", "inputs": {"image": ["4", 0]}},
            "5": {
                "class_type": "SaveImage",
                "inputs": {"images": ["4", 0], "filename_prefix": "x"},
            },
        }
    )
    out.append(("two outputs, each on a cycle", two_cycles))
    mixed = copy.deepcopy(pair)
    mixed.update(
        {
            "4": load_image("nope.png"),
            "5": {
                "class_type": "SaveImage",
                "inputs": {"images": ["4", 0], "filename_prefix": "x"},
            },
        }
    )
    out.append(("a cycle and a missing file", mixed))
    return out


def corpus() -> list[tuple[str, Prompt]]:
    """(what it is, the prompt) for each refused prompt, in a fixed order."""
    out: list[tuple[str, Prompt]] = []
    for name in MISSING_NAMES:
        out.append((f"LoadImage {name!r} into img2img", img2img(load_image(name))))
        out.append((f"LoadImage {name!r} previewed", preview(load_image(name))))
    for name in OUTPUT_MISSING:
        out.append(
            (f"LoadImageOutput {name!r} into img2img", img2img(load_image(name, "LoadImageOutput")))
        )
    mask = {"class_type": "MaskToImage", "inputs": {"mask": ["?", 0]}}
    for name, channel in (
        ("nope.png", "alpha"), ("made.png", "red"), ("sub/missing.png", "green"),
        ("missing.png [output]", "blue"), ("x.webp", "alpha"), ("example.png", "purple"),
        ("example.png", "Alpha"), ("example.png", ""), ("sub/in-sub.png", "rgb"),
        ("nope.png", "purple"), ("made.png", "A"), ("in-sub.png", "luma"),
    ):  # fmt: skip
        source = {"class_type": "LoadImageMask", "inputs": {"image": name, "channel": channel}}
        out.append((f"LoadImageMask {name!r} {channel!r}", img2img(source, mask)))
    for change in SCALE_ERRORS:
        out.append(
            (
                f"ImageScale {change} behind LoadImage",
                preview(load_image("example.png"), scaled(**change)),
            )
        )
        out.append(
            (
                f"ImageScale {change} behind LoadImage, saved",
                preview(load_image("sub/in-sub.png"), scaled(**change), saver="SaveImage"),
            )
        )
        out.append(
            (
                f"ImageScale {change} behind LoadImage into img2img",
                img2img(load_image("example.png"), scaled(**change)),
            )
        )
        out.append(
            (
                f"ImageScale {change} behind a custom node",
                preview(load_image("example.png"), size_check(), scaled(**change)),
            )
        )
        out.append(
            (
                f"ImageScale {change} behind a custom node into img2img",
                img2img(load_image("example.png"), size_check(16), scaled(**change)),
            )
        )
        out.append(
            (
                f"ImageScale {change} before a custom node",
                img2img(load_image("dir.png"), scaled(**change), size_check()),
            )
        )
    for multiple in (3, 5, 6, 7, 100, 12, 24, -4, "9"):
        out.append(
            (
                f"ImageSizeCheck multiple={multiple!r}",
                preview(load_image("example.png"), size_check(multiple)),
            )
        )
        out.append(
            (
                f"ImageSizeCheck multiple={multiple!r} into img2img",
                img2img(load_image("example.png"), size_check(multiple), invert()),
            )
        )
    for text in ("", "   ", "\n\t"):
        out.append(
            (
                f"CheckedTextEncode positive {text!r}",
                txt2img(positive="CheckedTextEncode", positive_text=text),
            )
        )
        out.append(
            (
                f"CheckedTextEncode negative {text!r}",
                txt2img(negative="CheckedTextEncode", negative_text=text),
            )
        )
    for prefix in ("../x", "a/../b", "..", "x..y"):
        out.append((f"CheckedSave prefix {prefix!r}", _checked_save(prefix)))
        out.append(
            (
                f"CheckedSave prefix {prefix!r} behind a missing file",
                _checked_save(prefix, "nope.png"),
            )
        )
    out.extend(cycles())
    for value, what in (
        (5, "a number"),
        (None, "null"),
        ([], "an empty list"),
        ({"__value__": 7}, "a wrapped number"),
    ):
        out.append((f"LoadImage image is {what}", img2img(load_image(value))))
    linked = preview(load_image(["0", 0]))
    linked["0"] = load_image("example.png")
    out.append(("LoadImage image linked from an IMAGE", linked))
    no_image = preview({"class_type": "LoadImage", "inputs": {}})
    out.append(("LoadImage without image", no_image))
    out.append(("LoadImageOutput image is a number", img2img(load_image(3, "LoadImageOutput"))))
    out.append(
        (
            "LoadImageMask without image",
            img2img({"class_type": "LoadImageMask", "inputs": {"channel": "alpha"}}, mask),
        )
    )
    two = img2img(load_image("nope.png"))
    two["12"] = load_image("made.png", "LoadImageOutput")
    two["13"] = {"class_type": "PreviewImage", "inputs": {"images": ["12", 0]}}
    out.append(("two outputs, two missing files", two))
    custom_missing = img2img(load_image("nope.png"), size_check(8))
    out.append(("a missing file behind a custom node", custom_missing))
    custom_both = img2img(load_image("nope.png"), size_check(3))
    out.append(("a missing file and a refusing custom node", custom_both))
    return out


def _checked_save(prefix: str, image: str = "example.png") -> Prompt:
    prompt = img2img(load_image(image))
    prompt["9"] = {
        "class_type": "CheckedSave",
        "inputs": {"images": ["8", 0], "filename_prefix": prefix},
    }
    return prompt


def answers() -> dict[str, dict[str, Any]]:
    """ComfyUI 0.3.64's answers, by what each prompt is: `status` and `body` (tracebacks
    emptied: they name ComfyUI's own files)."""
    return json.loads(ANSWERS.read_text())


def normal(body: Any) -> Any:
    """A refusal's body with what depends on the order ComfyUI iterates sets in (a node's
    inputs, the outputs) put in one order, and tracebacks emptied."""
    if not isinstance(body, dict) or "node_errors" not in body:
        return body
    body = copy.deepcopy(body)
    error = body.get("error") or {}
    if isinstance(error.get("details"), str):
        error["details"] = sorted(error["details"].split("\n"))
    for entry in body["node_errors"].values():
        for reason in entry["errors"]:
            if "traceback" in reason.get("extra_info", {}):
                reason["extra_info"]["traceback"] = []
        entry["errors"].sort(key=lambda r: json.dumps(r, sort_keys=True))
        entry["dependent_outputs"].sort()
    return body


def lay_out(input_dir: Path, output_dir: Path) -> None:
    """The files the corpus expects a ComfyUI to have, and the directory named like one."""
    png = bytes.fromhex("89504e470d0a1a0a")
    (input_dir / "sub").mkdir(parents=True, exist_ok=True)
    (input_dir / "example.png").write_bytes(png)
    (input_dir / "sub" / "in-sub.png").write_bytes(png)
    (input_dir / "dir.png").mkdir(exist_ok=True)
    output_dir.mkdir(parents=True, exist_ok=True)
    (output_dir / "made.png").write_bytes(png)
