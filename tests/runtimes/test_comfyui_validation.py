"""The gate's copy of ComfyUI 0.3.64's prompt validation, against bodies ComfyUI writes.

Expected bodies are written out as execution.py builds them (`validate_inputs`,
`validate_prompt`) and encoded as server.py's `web.json_response` does (json.dumps defaults).
The catalog is an `/object_info` answer shaped as server.py's `node_info` writes it for the
INPUT_TYPES of nodes.py, comfy_extras and a custom node pack.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from gpugate.runtimes.comfyui.catalog import (
    Catalog,
    Category,
    InputKind,
    parse_object_info,
)
from gpugate.runtimes.comfyui.node_validation import types_match
from gpugate.runtimes.comfyui.validation import (
    Outcome,
    Verdict,
    classes_to_refetch,
    validate,
)

MAX_RESOLUTION = 16384
SD15 = "v1-5-pruned-emaonly-fp16.safetensors"
CHECKPOINTS = [SD15, "sd_xl_base_1.0.safetensors"]
LORAS = [f"lora_{n:02}.safetensors" for n in range(25)]
SAMPLERS = [
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
SCHEDULERS = [
    "simple", "sgm_uniform", "karras", "exponential", "ddim_uniform", "beta", "normal",
    "linear_quadratic", "kl_optimal",
]  # fmt: skip
TEXT_ENCODERS = ["clip_l.safetensors", "t5xxl_fp8_e4m3fn.safetensors"]
DUAL_TYPES = ["sdxl", "sd3", "flux", "hunyuan_video", "hidream", "hunyuan_image"]
PREFIX_TIP = (
    "The prefix for the file to save. This may include formatting information such as "
    "%date:yyyy-MM-dd% or %Empty Latent Image.width% to include values from nodes."
)


def _v1(name: str, inputs: dict[str, Any], output: list[Any], **more: Any) -> dict[str, Any]:
    """server.py `node_info` of a V1 class (the fields validation reads, and some others)."""
    info = {
        "input": inputs,
        "input_order": {k: list(v) for k, v in inputs.items()},
        "output": output,
        "output_is_list": [False] * len(output),
        "output_name": output,
        "name": name,
        "display_name": name,
        "description": "",
        "python_module": "nodes",
        "category": "sd",
        "output_node": False,
    }
    info.update(more)
    return info


def object_info() -> dict[str, Any]:
    """A `GET /object_info` answer, decoded, for nodes.py's stock text-to-image classes."""
    tip = {"tooltip": "x"}
    ckpt_tip = {"tooltip": "The name of the checkpoint (model) to load."}
    strength = {"default": 1.0, "min": -100.0, "max": 100.0, "step": 0.01, **tip}
    size = {"default": 512, "min": 16, "max": MAX_RESOLUTION, "step": 8, **tip}
    seed = {"default": 0, "min": 0, "max": 0xFFFFFFFFFFFFFFFF, "control_after_generate": True}
    info = {
        "CheckpointLoaderSimple": _v1(
            "CheckpointLoaderSimple",
            {"required": {"ckpt_name": [CHECKPOINTS, ckpt_tip]}},
            ["MODEL", "CLIP", "VAE"],
        ),
        "KSampler": _v1(
            "KSampler",
            {
                "required": {
                    "model": ["MODEL", tip],
                    "seed": ["INT", {**seed, **tip}],
                    "steps": ["INT", {"default": 20, "min": 1, "max": 10000, **tip}],
                    "cfg": [
                        "FLOAT",
                        {
                            "default": 8.0,
                            "min": 0.0,
                            "max": 100.0,
                            "step": 0.1,
                            "round": 0.01,
                            **tip,
                        },
                    ],
                    "sampler_name": [SAMPLERS, tip],
                    "scheduler": [SCHEDULERS, tip],
                    "positive": ["CONDITIONING", tip],
                    "negative": ["CONDITIONING", tip],
                    "latent_image": ["LATENT", tip],
                    "denoise": [
                        "FLOAT",
                        {"default": 1.0, "min": 0.0, "max": 1.0, "step": 0.01, **tip},
                    ],
                }
            },
            ["LATENT"],
        ),
        "CLIPTextEncode": _v1(
            "CLIPTextEncode",
            {
                "required": {
                    "text": ["STRING", {"multiline": True, "dynamicPrompts": True, **tip}],
                    "clip": ["CLIP", tip],
                }
            },
            ["CONDITIONING"],
        ),
        "EmptyLatentImage": _v1(
            "EmptyLatentImage",
            {
                "required": {
                    "width": ["INT", size],
                    "height": ["INT", size],
                    "batch_size": ["INT", {"default": 1, "min": 1, "max": 4096, **tip}],
                }
            },
            ["LATENT"],
        ),
        "VAEDecode": _v1(
            "VAEDecode",
            {"required": {"samples": ["LATENT", tip], "vae": ["VAE", tip]}},
            ["IMAGE"],
        ),
        "SaveImage": _v1(
            "SaveImage",
            {
                "required": {
                    "images": ["IMAGE", {"tooltip": "The images to save."}],
                    "filename_prefix": ["STRING", {"default": "ComfyUI", "tooltip": PREFIX_TIP}],
                },
                "hidden": {"prompt": "PROMPT", "extra_pnginfo": "EXTRA_PNGINFO"},
            },
            [],
            output_node=True,
        ),
        "PreviewImage": _v1(
            "PreviewImage",
            {
                "required": {"images": ["IMAGE"]},
                "hidden": {"prompt": "PROMPT", "extra_pnginfo": "EXTRA_PNGINFO"},
            },
            [],
            output_node=True,
        ),
        "UNETLoader": _v1(
            "UNETLoader",
            {
                "required": {
                    "unet_name": [["flux1-dev-fp8.safetensors"]],
                    "weight_dtype": [["default", "fp8_e4m3fn", "fp8_e4m3fn_fast", "fp8_e5m2"]],
                }
            },
            ["MODEL"],
        ),
        "DualCLIPLoader": _v1(
            "DualCLIPLoader",
            {
                "required": {
                    "clip_name1": [TEXT_ENCODERS],
                    "clip_name2": [TEXT_ENCODERS],
                    "type": [DUAL_TYPES],
                },
                "optional": {"device": [["default", "cpu"], {"advanced": True}]},
            },
            ["CLIP"],
        ),
        "VAELoader": _v1(
            "VAELoader", {"required": {"vae_name": [["ae.safetensors", "taesd"]]}}, ["VAE"]
        ),
        "LoraLoader": _v1(
            "LoraLoader",
            {
                "required": {
                    "model": ["MODEL", tip],
                    "clip": ["CLIP", tip],
                    "lora_name": [LORAS, tip],
                    "strength_model": ["FLOAT", strength],
                    "strength_clip": ["FLOAT", strength],
                }
            },
            ["MODEL", "CLIP"],
        ),
        "LoadImage": _v1(
            "LoadImage",
            {"required": {"image": [["example.png"], {"image_upload": True}]}},
            ["IMAGE", "MASK"],
        ),
        # A V3 class (comfy_extras/nodes_video.py SaveVideo), as GET_NODE_INFO_V1 writes it.
        "SaveVideo": _v1(
            "SaveVideo",
            {
                "required": {
                    "video": ["VIDEO", {"tooltip": "The video to save."}],
                    "filename_prefix": [
                        "STRING",
                        {"tooltip": PREFIX_TIP, "default": "video/ComfyUI"},
                    ],
                    "format": [
                        "COMBO",
                        {
                            "tooltip": "The format to save the video as.",
                            "default": "auto",
                            "multiselect": False,
                            "options": ["auto", "mp4"],
                        },
                    ],
                    "codec": [
                        "COMBO",
                        {
                            "tooltip": "The codec to use for the video.",
                            "default": "auto",
                            "multiselect": False,
                            "options": ["auto", "h264"],
                        },
                    ],
                },
                "hidden": {"prompt": ["PROMPT"], "extra_pnginfo": ["EXTRA_PNGINFO"]},
            },
            [],
            python_module="comfy_extras.nodes_video",
            output_node=True,
            deprecated=False,
            experimental=False,
            api_node=False,
        ),
        "CreateVideo": _v1(
            "CreateVideo",
            {
                "required": {
                    "images": ["IMAGE", tip],
                    "fps": ["FLOAT", {"default": 30.0, "min": 1.0, "max": 120.0, "step": 1.0}],
                }
            },
            ["VIDEO"],
            python_module="comfy_extras.nodes_video",
        ),
        "Reroute Any": _v1(
            "Reroute Any", {"required": {"value": ["*"]}}, ["*"], python_module="nodes"
        ),
        "Image Sharpen (pack)": _v1(
            "Image Sharpen (pack)",
            {
                "required": {
                    "image": ["IMAGE"],
                    "radius": ["INT", {"default": 1, "min": 1, "max": 31}],
                }
            },
            ["IMAGE"],
            python_module="custom_nodes.example-pack",
        ),
    }
    # As the gate reads it: off the wire, so tuples are lists and floats stay floats.
    return json.loads(json.dumps(info))


@pytest.fixture
def catalog() -> Catalog:
    return parse_object_info(object_info())


def txt2img(**ksampler: Any) -> dict[str, Any]:
    """ComfyUI's default workflow in API format."""
    sampler = {
        "seed": 8566257, "steps": 20, "cfg": 8.0, "sampler_name": "euler",
        "scheduler": "normal", "denoise": 1.0, "model": ["4", 0], "positive": ["6", 0],
        "negative": ["7", 0], "latent_image": ["5", 0],
    }  # fmt: skip
    sampler.update(ksampler)
    return {
        "3": {"class_type": "KSampler", "inputs": sampler},
        "4": {"class_type": "CheckpointLoaderSimple", "inputs": {"ckpt_name": SD15}},
        "5": {"class_type": "EmptyLatentImage",
              "inputs": {"width": 512, "height": 512, "batch_size": 1}},
        "6": {"class_type": "CLIPTextEncode", "inputs": {"text": "a cat", "clip": ["4", 1]}},
        "7": {"class_type": "CLIPTextEncode", "inputs": {"text": "", "clip": ["4", 1]}},
        "8": {"class_type": "VAEDecode", "inputs": {"samples": ["3", 0], "vae": ["4", 2]}},
        "9": {"class_type": "SaveImage",
              "inputs": {"filename_prefix": "ComfyUI", "images": ["8", 0]}},
    }  # fmt: skip


def reason(kind: str, message: str, details: str, **extra: Any) -> dict[str, Any]:
    return {"type": kind, "message": message, "details": details, "extra_info": extra}


def body(error: dict[str, Any], node_errors: dict[str, Any]) -> bytes:
    """What aiohttp's `web.json_response({"error": ..., "node_errors": ...})` writes."""
    return json.dumps({"error": error, "node_errors": node_errors}).encode()


def failed(*reasons: dict[str, Any]) -> dict[str, Any]:
    """execution.py's `prompt_outputs_failed_validation` for the output nodes' own reasons.

    Its details list only the reasons of the outputs themselves: an output invalid through
    its inputs adds none.
    """
    details = "\n".join(f"{r['message']}: {r['details']}" for r in reasons)
    return reason("prompt_outputs_failed_validation", "Prompt outputs failed validation", details)


def node(class_type: str, *reasons: dict[str, Any], outputs: tuple[str, ...] = ("9",)) -> Any:
    return {"errors": list(reasons), "dependent_outputs": list(outputs), "class_type": class_type}


def config(catalog: Catalog, class_type: str, name: str) -> list[Any]:
    spec = catalog.nodes[class_type].input(name)
    assert spec is not None
    return spec.config


def refused(verdict: Verdict) -> dict[str, Any]:
    assert verdict.outcome is Outcome.REFUSE, verdict
    return json.loads(verdict.body)


# -- the catalog ------------------------------------------------------------------------------


def test_catalog_reads_kinds_bounds_and_outputs(catalog: Catalog) -> None:
    sampler = catalog.nodes["KSampler"]
    assert [i.name for i in sampler.validated_inputs][:3] == ["model", "seed", "steps"]
    steps = sampler.input("steps")
    assert steps is not None and steps.kind is InputKind.INT
    assert (steps.minimum, steps.maximum) == (1, 10000)
    cfg = sampler.input("cfg")
    assert cfg is not None and cfg.kind is InputKind.FLOAT and cfg.maximum == 100.0
    name = sampler.input("sampler_name")
    assert name is not None and name.kind is InputKind.LIST and name.choices == tuple(SAMPLERS)
    model = sampler.input("model")
    assert model is not None and model.kind is InputKind.OTHER and model.type_name == "MODEL"
    assert sampler.outputs == ("LATENT",) and not sampler.output_node and not sampler.by_code
    save = catalog.nodes["SaveImage"]
    assert save.output_node
    assert {i.name for i in save.inputs if i.category is Category.HIDDEN} == {
        "prompt",
        "extra_pnginfo",
    }
    assert [i.name for i in save.validated_inputs] == ["images", "filename_prefix"]
    device = catalog.nodes["DualCLIPLoader"].input("device")
    assert device is not None and device.category is Category.OPTIONAL
    fmt = catalog.nodes["SaveVideo"].input("format")
    assert fmt is not None and fmt.kind is InputKind.OTHER and fmt.choices == ("auto", "mp4")


def test_catalog_marks_classes_that_validate_by_code(catalog: Catalog) -> None:
    # LoadImage's code is a file check the gate runs itself.
    load = catalog.nodes["LoadImage"]
    assert not load.by_code and load.file_check is not None
    assert load.file_check.input == "image"
    assert catalog.nodes["Image Sharpen (pack)"].by_code
    assert not catalog.nodes["SaveVideo"].by_code
    odd = parse_object_info({"Odd": {"input": {"required": {"x": "INT"}}, "output": []}})
    assert odd.nodes["Odd"].by_code
    assert parse_object_info([]).nodes == {}
    assert catalog.custom_modules == {"custom_nodes.example-pack"}


def test_input_config_is_the_declaration_with_empty_options(catalog: Catalog) -> None:
    assert config(catalog, "UNETLoader", "weight_dtype") == [
        ["default", "fp8_e4m3fn", "fp8_e4m3fn_fast", "fp8_e5m2"],
        {},
    ]
    assert config(catalog, "KSampler", "steps") == [
        "INT",
        {"default": 20, "min": 1, "max": 10000, "tooltip": "x"},
    ]


def test_types_match_as_validate_node_input() -> None:
    assert types_match("IMAGE", "IMAGE")
    assert types_match("FLOAT", "FLOAT,INT")
    assert types_match("INT, STRING", "STRING")
    assert not types_match("LATENT", "IMAGE")
    assert not types_match("STRING", ["a", "b"])
    assert types_match(["a", "b"], ["a", "b"])


# -- prompts ComfyUI queues -------------------------------------------------------------------


def test_the_default_workflow_is_queued(catalog: Catalog) -> None:
    verdict = validate(txt2img(), catalog)
    assert verdict.outcome is Outcome.QUEUE and verdict.failures == ()
    assert verdict.will_queue


def test_values_are_converted_as_comfyui_converts_them(catalog: Catalog) -> None:
    # int("20") and float("7.5") succeed; True is an int; 3.9 truncates to 3 (within min 1).
    for changes in ({"steps": "20"}, {"cfg": "7.5"}, {"steps": True}, {"steps": 3.9}):
        assert validate(txt2img(**changes), catalog).outcome is Outcome.QUEUE, changes


def test_value_wrapped_in_dunder_value_is_unwrapped(catalog: Catalog) -> None:
    assert validate(txt2img(steps={"__value__": 12}), catalog).outcome is Outcome.QUEUE


def test_literal_for_a_link_input_and_extra_inputs_pass(catalog: Catalog) -> None:
    # ComfyUI converts and bounds only INT/FLOAT/STRING/BOOLEAN and value lists.
    assert validate(txt2img(model="not a link", extra=[1]), catalog).outcome is Outcome.QUEUE


def test_combo_with_options_is_not_checked(catalog: Catalog) -> None:
    # `isinstance(input_type, list)` is False for ("COMBO", {"options": [...]}).
    prompt = txt2img()
    prompt["10"] = {"class_type": "CreateVideo", "inputs": {"images": ["8", 0], "fps": 24}}
    prompt["11"] = {
        "class_type": "SaveVideo",
        "inputs": {"video": ["10", 0], "filename_prefix": "v", "format": "mkv", "codec": 5},
    }
    del prompt["9"]
    assert validate(prompt, catalog).outcome is Outcome.QUEUE


def test_one_valid_output_queues_with_node_errors(catalog: Catalog) -> None:
    prompt = txt2img()
    prompt["10"] = {"class_type": "PreviewImage", "inputs": {"images": ["8", 7]}}
    verdict = validate(prompt, catalog)
    assert verdict.outcome is Outcome.QUEUE
    assert [f.node_id for f in verdict.failures] == ["10"]


# -- refusals before any node is validated ----------------------------------------------------


def test_unknown_class_is_invalid_prompt(catalog: Catalog) -> None:
    prompt = txt2img()
    prompt["5"]["class_type"] = "EmptySD3LatentImage"
    error = reason(
        "invalid_prompt",
        "Cannot execute because node EmptySD3LatentImage does not exist.",
        "Node ID '#5'",
    )
    verdict = validate(prompt, catalog)
    assert verdict.body == body(error, {})
    assert verdict.error_type == "invalid_prompt"
    assert verdict.refetch == {"EmptySD3LatentImage"}


def test_missing_class_type_is_invalid_prompt(catalog: Catalog) -> None:
    prompt = txt2img()
    del prompt["6"]["class_type"]
    error = reason(
        "invalid_prompt",
        "Cannot execute because a node is missing the class_type property.",
        "Node ID '#6'",
    )
    assert validate(prompt, catalog).body == body(error, {})


def test_no_output_node(catalog: Catalog) -> None:
    prompt = txt2img()
    del prompt["9"]
    error = reason("prompt_no_outputs", "Prompt has no outputs", "")
    assert validate(prompt, catalog).body == body(error, {})


def test_partial_execution_targets_choose_outputs(catalog: Catalog) -> None:
    error = reason("prompt_no_outputs", "Prompt has no outputs", "")
    assert validate(txt2img(), catalog, ["8"]).body == body(error, {})
    assert validate(txt2img(), catalog, ["9"]).outcome is Outcome.QUEUE


# -- per-node errors --------------------------------------------------------------------------


def test_checkpoint_not_on_disk(catalog: Catalog) -> None:
    prompt = txt2img()
    prompt["4"]["inputs"]["ckpt_name"] = "missing.safetensors"
    why = reason(
        "value_not_in_list",
        "Value not in list",
        f"ckpt_name: 'missing.safetensors' not in {CHECKPOINTS!s}",
        input_name="ckpt_name",
        input_config=config(catalog, "CheckpointLoaderSimple", "ckpt_name"),
        received_value="missing.safetensors",
    )
    verdict = validate(prompt, catalog)
    assert verdict.body == body(failed(), {"4": node("CheckpointLoaderSimple", why)})
    assert verdict.refetch == {"CheckpointLoaderSimple"}
    assert verdict.exact


def test_value_not_in_a_long_list_hides_the_list(catalog: Catalog) -> None:
    why = reason(
        "value_not_in_list",
        "Value not in list",
        f"sampler_name: 'euler_b' not in (list of length {len(SAMPLERS)})",
        input_name="sampler_name",
        input_config=None,
        received_value="euler_b",
    )
    verdict = validate(txt2img(sampler_name="euler_b"), catalog)
    assert verdict.body == body(failed(), {"3": node("KSampler", why)})


def test_required_input_missing(catalog: Catalog) -> None:
    prompt = txt2img()
    del prompt["3"]["inputs"]["seed"]
    why = reason("required_input_missing", "Required input is missing", "seed", input_name="seed")
    assert validate(prompt, catalog).body == body(failed(), {"3": node("KSampler", why)})


def test_optional_input_may_be_missing(catalog: Catalog) -> None:
    prompt = txt2img()
    prompt["2"] = {
        "class_type": "DualCLIPLoader",
        "inputs": {"clip_name1": TEXT_ENCODERS[0], "clip_name2": TEXT_ENCODERS[1], "type": "flux"},
    }
    prompt["6"]["inputs"]["clip"] = ["2", 0]
    assert validate(prompt, catalog).outcome is Outcome.QUEUE


def test_smaller_than_min_after_int_conversion(catalog: Catalog) -> None:
    # int(0.5) is 0: ComfyUI compares and reports the converted value.
    why = reason(
        "value_smaller_than_min",
        "Value 0 smaller than min of 1",
        "steps",
        input_name="steps",
        input_config=config(catalog, "KSampler", "steps"),
        received_value=0,
    )
    verdict = validate(txt2img(steps=0.5), catalog)
    assert verdict.body == body(failed(), {"3": node("KSampler", why)})
    assert verdict.refetch == frozenset()


def test_bigger_than_max(catalog: Catalog) -> None:
    prompt = txt2img()
    prompt["5"]["inputs"]["width"] = 20000
    why = reason(
        "value_bigger_than_max",
        "Value 20000 bigger than max of 16384",
        "width",
        input_name="width",
        input_config=config(catalog, "EmptyLatentImage", "width"),
        received_value=20000,
    )
    assert validate(prompt, catalog).body == body(failed(), {"5": node("EmptyLatentImage", why)})


@pytest.mark.parametrize(
    ("field", "value", "kind", "text"),
    [
        ("steps", "twenty", "INT", "invalid literal for int() with base 10: 'twenty'"),
        ("steps", None, "INT",
         "int() argument must be a string, a bytes-like object or a real number, not 'NoneType'"),
        ("cfg", "high", "FLOAT", "could not convert string to float: 'high'"),
        ("cfg", {"a": 1}, "FLOAT",
         "float() argument must be a string or a real number, not 'dict'"),
    ],
)  # fmt: skip
def test_invalid_input_type(catalog: Catalog, field: str, value: Any, kind: str, text: str) -> None:
    why = reason(
        "invalid_input_type",
        f"Failed to convert an input value to a {kind} value",
        f"{field}, {value}, {text}",
        input_name=field,
        input_config=config(catalog, "KSampler", field),
        received_value=value,
        exception_message=text,
    )
    verdict = validate(txt2img(**{field: value}), catalog)
    assert verdict.body == body(failed(), {"3": node("KSampler", why)})


def test_bad_linked_input(catalog: Catalog) -> None:
    why = reason(
        "bad_linked_input",
        "Bad linked input, must be a length-2 list of [node_id, slot_index]",
        "model",
        input_name="model",
        input_config=config(catalog, "KSampler", "model"),
        received_value=["4", 0, 1],
    )
    verdict = validate(txt2img(model=["4", 0, 1]), catalog)
    assert verdict.body == body(failed(), {"3": node("KSampler", why)})


def test_return_type_mismatch(catalog: Catalog) -> None:
    why = reason(
        "return_type_mismatch",
        "Return type mismatch between linked nodes",
        "model, received_type(CLIP) mismatch input_type(MODEL)",
        input_name="model",
        input_config=config(catalog, "KSampler", "model"),
        received_type="CLIP",
        linked_node=["4", 1],
    )
    verdict = validate(txt2img(model=["4", 1]), catalog)
    assert verdict.body == body(failed(), {"3": node("KSampler", why)})


def test_errors_of_several_nodes_and_dependent_outputs(catalog: Catalog) -> None:
    prompt = txt2img(steps=0)
    prompt["4"]["inputs"]["ckpt_name"] = "gone.safetensors"
    prompt["10"] = {"class_type": "PreviewImage", "inputs": {"images": ["8", 0]}}
    got = refused(validate(prompt, catalog))
    assert list(got["node_errors"]) == ["4", "3"]
    assert got["node_errors"]["4"]["dependent_outputs"] == ["9", "10"]
    assert got["node_errors"]["3"]["errors"][0]["type"] == "value_smaller_than_min"
    # Each failed output lists its reasons again (none of its own here: the output is
    # invalid only through its inputs), in output order.
    assert got["error"]["details"] == ""


def test_output_own_errors_are_listed_once_per_output(catalog: Catalog) -> None:
    prompt = txt2img()
    del prompt["9"]["inputs"]["images"]
    prompt["10"] = {"class_type": "PreviewImage", "inputs": {}}
    got = refused(validate(prompt, catalog))
    assert got["error"]["details"] == (
        "Required input is missing: images\nRequired input is missing: images"
    )
    assert list(got["node_errors"]) == ["9", "10"]


def test_link_to_a_missing_node_raises_in_the_output(catalog: Catalog) -> None:
    prompt = txt2img()
    prompt["9"]["inputs"]["images"] = ["99", 0]
    why = reason(
        "exception_during_validation",
        "Exception when validating node",
        "'99'",
        exception_type="KeyError",
        traceback=[],
    )
    verdict = validate(prompt, catalog)
    assert verdict.body == body(failed(why), {"9": node("SaveImage", why)})
    assert not verdict.exact


def test_link_to_a_missing_node_raises_inside(catalog: Catalog) -> None:
    why = reason(
        "exception_during_inner_validation",
        "Exception when validating inner node",
        "tuple index out of range",
        input_name="images",
        input_config=config(catalog, "SaveImage", "images"),
        exception_message="tuple index out of range",
        exception_type="IndexError",
        traceback=[],
        linked_node=["10", 0],
    )
    # Node 10 raises (slot 5 of KSampler's one output); SaveImage 11, validating it, records
    # the exception against node 10 in its own terms: its input, its link.
    prompt = txt2img()
    prompt["10"] = {"class_type": "VAEDecode", "inputs": {"samples": ["3", 5], "vae": ["4", 2]}}
    prompt["11"] = {"class_type": "SaveImage", "inputs": {"images": ["10", 0]}}
    # Only output 11 fails: the prompt queues, with node 10's exception reported.
    verdict = validate(prompt, catalog)
    assert verdict.outcome is Outcome.QUEUE
    assert [(f.node_id, f.errors) for f in verdict.failures] == [
        ("10", ("exception_during_inner_validation",)),
        ("11", ("required_input_missing",)),
    ]
    del prompt["9"]
    prompt["11"]["inputs"]["filename_prefix"] = "x"
    verdict = validate(prompt, catalog)
    assert verdict.body == body(failed(), {"10": node("VAEDecode", why, outputs=("11",))})
    assert not verdict.exact


def test_the_prompt_is_not_changed(catalog: Catalog) -> None:
    prompt = txt2img(steps="20", cfg={"__value__": 2})
    before = copy.deepcopy(prompt)
    validate(prompt, catalog)
    assert prompt == before


# -- what the catalog cannot decide -----------------------------------------------------------


def test_a_file_not_asked_about_is_unknown(catalog: Catalog) -> None:
    prompt = txt2img()
    prompt["10"] = {"class_type": "LoadImage", "inputs": {"image": "missing.png"}}
    prompt["9"]["inputs"]["images"] = ["10", 0]
    verdict = validate(prompt, catalog)
    assert verdict.outcome is Outcome.UNKNOWN and verdict.will_queue
    assert "missing.png" in verdict.reason


def test_custom_node_behind_an_invalid_one_is_invalid(catalog: Catalog) -> None:
    # Whatever its own code says, it links to a node that fails: ComfyUI refuses the
    # output, in words only it can write (the pack's own errors, if any).
    prompt = txt2img()
    prompt["10"] = {"class_type": "Image Sharpen (pack)", "inputs": {"image": ["8", 0]}}
    prompt["9"]["inputs"]["images"] = ["10", 0]
    prompt["4"]["inputs"]["ckpt_name"] = "missing.safetensors"
    verdict = validate(prompt, catalog)
    assert verdict.outcome is Outcome.REFUSE and not verdict.exact
    assert "validates by code" in verdict.reason


def test_custom_node_in_the_path_of_a_valid_graph_is_unknown(catalog: Catalog) -> None:
    prompt = txt2img()
    prompt["10"] = {"class_type": "Image Sharpen (pack)", "inputs": {"image": ["8", 0]}}
    prompt["9"]["inputs"]["images"] = ["10", 0]
    verdict = validate(prompt, catalog)
    assert verdict.outcome is Outcome.UNKNOWN and "validates by code" in verdict.reason


def test_custom_node_outside_validated_paths_does_not_matter(catalog: Catalog) -> None:
    prompt = txt2img()
    prompt["10"] = {"class_type": "Image Sharpen (pack)", "inputs": {"image": ["8", 0]}}
    prompt["4"]["inputs"]["ckpt_name"] = "missing.safetensors"
    verdict = validate(prompt, catalog)
    assert verdict.outcome is Outcome.REFUSE and verdict.exact


def test_any_type_mismatch_is_unknown(catalog: Catalog) -> None:
    prompt = txt2img()
    prompt["10"] = {"class_type": "Reroute Any", "inputs": {"value": ["8", 0]}}
    prompt["9"]["inputs"]["images"] = ["10", 0]
    assert validate(prompt, catalog).outcome is Outcome.UNKNOWN


def test_cycle_is_refused_in_comfyuis_words(catalog: Catalog) -> None:
    verdict = validate(txt2img(latent_image=["3", 0]), catalog)
    assert verdict.outcome is Outcome.REFUSE and not verdict.exact
    assert verdict.reason == "the graph has a cycle"


def test_long_chain_is_unknown(catalog: Catalog) -> None:
    prompt = txt2img()
    # The text encoder's clip comes through 300 LoRA loaders, each linked to the next.
    prompt["6"]["inputs"]["clip"] = ["t0", 1]
    for n in range(300):
        prompt[f"t{n}"] = {
            "class_type": "LoraLoader",
            "inputs": {"model": ["4", 0], "clip": [f"t{n + 1}", 1] if n < 299 else ["4", 1],
                       "lora_name": LORAS[0], "strength_model": 1.0, "strength_clip": 1.0},
        }  # fmt: skip
    verdict = validate(prompt, catalog)
    assert verdict.outcome is Outcome.UNKNOWN and "deeper" in verdict.reason


def test_custom_output_type_mismatch_is_unknown(catalog: Catalog) -> None:
    # A pack's "IMAGE" may be a str whose `__ne__` matches LATENT too.
    prompt = txt2img()
    prompt["10"] = {"class_type": "Image Sharpen (pack)", "inputs": {"image": ["5", 0]}}
    prompt["8"]["inputs"]["samples"] = ["10", 0]
    verdict = validate(prompt, catalog)
    assert verdict.outcome is Outcome.UNKNOWN and "validates by code" in verdict.reason


def test_custom_output_in_a_cycle_is_refused(catalog: Catalog) -> None:
    # The link either matches, and ComfyUI recurses round the cycle, or it does not, and
    # VAEDecode has a return_type_mismatch: refused either way.
    prompt = txt2img()
    prompt["10"] = {"class_type": "Image Sharpen (pack)", "inputs": {"image": ["8", 0]}}
    prompt["8"]["inputs"]["samples"] = ["10", 0]
    verdict = validate(prompt, catalog)
    assert verdict.outcome is Outcome.REFUSE and not verdict.exact


def test_shapes_comfyui_answers_with_500_are_unknown(catalog: Catalog) -> None:
    assert validate([], catalog).outcome is Outcome.UNKNOWN
    assert validate({"1": 5}, catalog).outcome is Outcome.UNKNOWN
    assert validate({"1": {"class_type": ["x"]}}, catalog).outcome is Outcome.UNKNOWN
    assert validate(txt2img(), catalog, 5).outcome is Outcome.UNKNOWN


# -- the request body and freshness -----------------------------------------------------------


def test_refusal_for_a_file_is_trusted_after_refetch(catalog: Catalog) -> None:
    prompt = txt2img()
    prompt["4"]["inputs"]["ckpt_name"] = "new.safetensors"
    verdict = validate(prompt, catalog)
    assert classes_to_refetch(verdict) == {"CheckpointLoaderSimple"}
    # The file arrived since the catalog was read: the class's fresh listing has it.
    fresh = object_info()["CheckpointLoaderSimple"]
    fresh["input"]["required"]["ckpt_name"][0].append("new.safetensors")
    updated = catalog.refreshed(
        ["CheckpointLoaderSimple"], parse_object_info({"CheckpointLoaderSimple": fresh})
    )
    assert validate(prompt, updated).outcome is Outcome.QUEUE
    # Or it did not: the same refusal, now trusted.
    again = catalog.refreshed(
        ["CheckpointLoaderSimple"],
        parse_object_info({"CheckpointLoaderSimple": object_info()["CheckpointLoaderSimple"]}),
    )
    second = validate(prompt, again)
    assert second.body == verdict.body
    assert classes_to_refetch(second, fresh={"CheckpointLoaderSimple"}) == frozenset()


def test_unknown_class_refetched_and_still_absent(catalog: Catalog) -> None:
    prompt = txt2img()
    prompt["9"]["class_type"] = "SaveImageWebsocket"
    verdict = validate(prompt, catalog)
    assert classes_to_refetch(verdict) == {"SaveImageWebsocket"}
    # `/object_info/SaveImageWebsocket` answers {} when the class does not exist.
    updated = catalog.refreshed(["SaveImageWebsocket"], parse_object_info({}))
    assert classes_to_refetch(validate(prompt, updated), {"SaveImageWebsocket"}) == frozenset()


def test_queue_and_unknown_need_no_refetch(catalog: Catalog) -> None:
    assert classes_to_refetch(validate(txt2img(), catalog)) == frozenset()
    assert classes_to_refetch(validate({"1": 5}, catalog)) == frozenset()


@pytest.mark.parametrize(("count", "shown"), [(20, True), (21, False)])
def test_lists_longer_than_20_are_not_sent_back(count: int, shown: bool) -> None:
    names = [f"m{n}.safetensors" for n in range(count)]
    info = object_info()
    info["CheckpointLoaderSimple"]["input"]["required"]["ckpt_name"] = [names]
    prompt = txt2img()
    prompt["4"]["inputs"]["ckpt_name"] = SD15
    got = refused(validate(prompt, parse_object_info(info)))
    extra = got["node_errors"]["4"]["errors"][0]["extra_info"]
    listed = str(names) if shown else f"(list of length {count})"
    assert got["node_errors"]["4"]["errors"][0]["details"] == f"ckpt_name: '{SD15}' not in {listed}"
    assert extra["input_config"] == ([names, {}] if shown else None)
