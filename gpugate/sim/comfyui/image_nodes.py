"""The simulated ComfyUI's image classes: the LoadImage family (whose VALIDATE_INPUTS checks
that the named file exists), and the image nodes prompts put after them.

Declared as ComfyUI 0.3.64 declares them (nodes.py `LoadImage`, `LoadImageMask`,
`LoadImageOutput`, `ImageScale`, `ImageInvert`, `VAEEncode`; comfy_extras/nodes_mask.py
`MaskToImage`), as its `/object_info` serves them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import attrs

from gpugate.sim.comfyui.nodetypes import (
    INPUT_FILES,
    INPUT_IMAGES,
    MAX_RESOLUTION,
    InputDef,
    NodeDef,
    Validate,
    Work,
)

UPSCALE_METHODS = ("nearest-exact", "bilinear", "area", "bicubic", "lanczos")
CROP_METHODS = ("disabled", "center")
MASK_CHANNELS = ("alpha", "red", "green", "blue")


def _image_exists(values: Mapping[str, Any], exists: Callable[[str], bool]) -> bool | str:
    """nodes.py:1700 `LoadImage.VALIDATE_INPUTS` (and LoadImageMask's, the same words)."""
    image = values["image"]
    if not exists(image):
        return f"Invalid image file: {image}"
    return True


def _load(name: str, function: str, *more: InputDef, **image: Any) -> NodeDef:
    listed = not image
    options = image or {"image_upload": True}
    return NodeDef(
        name,
        Work.LOAD_IMAGE,
        (
            InputDef(
                "image",
                "COMBO",
                options,
                folder=(INPUT_FILES if name == "LoadImageMask" else INPUT_IMAGES)
                if listed
                else None,
                listed=listed,
            ),
            *more,
        ),
        ("MASK",) if name == "LoadImageMask" else ("IMAGE", "MASK"),
        "mask" if name == "LoadImageMask" else "image",
        {
            "LoadImage": "Load Image",
            "LoadImageMask": "Load Image (as Mask)",
            "LoadImageOutput": "Load Image (from Outputs)",
        }[name],
        validate=Validate(("image",), _image_exists, function),
    )


_OUTPUT_DESCRIPTION = (
    "Load an image from the output folder. When the refresh button is clicked, the node will "
    "update the image list and automatically select the first image, allowing for easy "
    "iteration."
)

IMAGE_NODES = (
    NodeDef("VAEEncode", Work.ENCODE_IMAGE, (
        InputDef("pixels", "IMAGE"), InputDef("vae", "VAE"),
    ), ("LATENT",), "latent", "VAE Encode"),
    _load("LoadImage", "LoadImage.VALIDATE_INPUTS"),
    _load("LoadImageMask", "LoadImageMask.VALIDATE_INPUTS",
          InputDef("channel", "COMBO", choices=MASK_CHANNELS)),
    NodeDef("ImageScale", Work.PASS_IMAGE, (
        InputDef("image", "IMAGE"),
        InputDef("upscale_method", "COMBO", choices=UPSCALE_METHODS),
        InputDef("width", "INT", {"default": 512, "min": 0, "max": MAX_RESOLUTION, "step": 1}),
        InputDef("height", "INT", {"default": 512, "min": 0, "max": MAX_RESOLUTION, "step": 1}),
        InputDef("crop", "COMBO", choices=CROP_METHODS),
    ), ("IMAGE",), "image/upscaling", "Upscale Image"),
    NodeDef("ImageInvert", Work.PASS_IMAGE, (InputDef("image", "IMAGE"),), ("IMAGE",), "image",
            "Invert Image"),
)  # fmt: skip
"""nodes.py's classes, in NODE_CLASS_MAPPINGS order."""

LOAD_IMAGE_OUTPUT = attrs.evolve(
    _load(
        "LoadImageOutput",
        # It inherits LoadImage's VALIDATE_INPUTS, which looks in the input folder.
        "LoadImage.VALIDATE_INPUTS",
        image_upload=True,
        image_folder="output",
        remote={
            "route": "/internal/files/output",
            "refresh_button": True,
            "control_after_refresh": "first",
        },
    ),
    description=_OUTPUT_DESCRIPTION,
    experimental=True,
)
"""Registered after the nodes.py classes above, and marked experimental."""

MASK_TO_IMAGE = NodeDef(
    "MaskToImage",
    Work.PASS_IMAGE,
    (InputDef("mask", "MASK"),),
    ("IMAGE",),
    "mask",
    "Convert Mask to Image",
    python_module="comfy_extras.nodes_mask",
)
