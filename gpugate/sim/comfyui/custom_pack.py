"""Custom node packs the simulated ComfyUI can load (`custom_nodes` in its section): classes
whose VALIDATE_INPUTS is their own code, which only ComfyUI can run.

`checked_nodes` is a small pack as any custom_nodes/checked_nodes.py could define it: V1
classes (python_module `custom_nodes.checked_nodes`) each with a VALIDATE_INPUTS. ComfyUI
calls it with the inputs it names, skips those inputs' min, max and value-list checks, and
turns anything but True into `custom_validation_failed` ("{input} - {message}"; the input
alone for False) for each input it names (execution.py `validate_inputs`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from gpugate.sim.comfyui.nodetypes import InputDef, NodeDef, Validate, Work

MODULE = "custom_nodes.checked_nodes"


def _power_of_two(values: Mapping[str, Any], exists: Callable[[str], bool]) -> bool | str:
    multiple = values["multiple"]
    if multiple & (multiple - 1):
        return "multiple must be a power of two"
    return True


def _not_blank(values: Mapping[str, Any], exists: Callable[[str], bool]) -> bool | str:
    return bool(values["text"].strip())


def _no_dot_dot(values: Mapping[str, Any], exists: Callable[[str], bool]) -> bool | str:
    prefix = values["filename_prefix"]
    if ".." in prefix:
        return f"Invalid prefix: {prefix}"
    return True


CHECKED_NODES = (
    NodeDef(
        "ImageSizeCheck",
        Work.PASS_IMAGE,
        (
            InputDef("image", "IMAGE"),
            InputDef("multiple", "INT", {"default": 8, "min": 1, "max": 64}),
        ),
        ("IMAGE",),
        "checked",
        python_module=MODULE,
        validate=Validate(("multiple",), _power_of_two, "ImageSizeCheck.VALIDATE_INPUTS"),
    ),
    NodeDef(
        "CheckedTextEncode",
        Work.ENCODE_TEXT,
        (InputDef("text", "STRING", {"multiline": True}), InputDef("clip", "CLIP")),
        ("CONDITIONING",),
        "checked",
        python_module=MODULE,
        validate=Validate(("text",), _not_blank, "CheckedTextEncode.VALIDATE_INPUTS"),
    ),
    NodeDef(
        "CheckedSave",
        Work.SAVE_IMAGE,
        (
            InputDef("images", "IMAGE"),
            InputDef("filename_prefix", "STRING", {"default": "checked"}),
        ),
        (),
        "checked",
        output_node=True,
        python_module=MODULE,
        validate=Validate(("filename_prefix",), _no_dot_dot, "CheckedSave.VALIDATE_INPUTS"),
    ),
)

PACKS: dict[str, tuple[NodeDef, ...]] = {"checked_nodes": CHECKED_NODES}
