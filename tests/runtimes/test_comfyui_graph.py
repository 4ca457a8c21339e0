"""Reading a ComfyUI prompt: the model files its outputs load, its largest latent, its key."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpugate.runtimes.comfyui.graph import (
    KEY_MAX,
    NO_FILES_KEY,
    ModelFile,
    PromptDemand,
    TooDeep,
    Unreadable,
    files_key,
    nesting,
    read_prompt,
)
from gpugate_sim.comfyui.validation import validate_prompt
from tests.runtimes.comfyui_workflows import (
    CONTROLNET,
    FILES,
    LORA,
    SD15,
    UPSCALER,
    blank,
    body,
    controlnet,
    flux,
    lora,
    txt2img,
    upscale,
)

FLUX_FILES = (
    ModelFile("diffusion_models", "flux1-dev-fp8.safetensors"),
    ModelFile("text_encoders", "clip_l.safetensors"),
    ModelFile("text_encoders", "t5xxl_fp8_e4m3fn.safetensors"),
    ModelFile("vae", "ae.safetensors"),
)


def demand(graph: object, **fields: object) -> PromptDemand:
    read = read_prompt(body(graph, **fields))
    assert isinstance(read, PromptDemand), read
    return read


@pytest.mark.parametrize("graph", [txt2img(), flux(), blank(), lora(), controlnet(), upscale()])
def test_the_graphs_are_ones_the_simulated_comfyui_accepts(graph: dict[str, Any]) -> None:
    assert validate_prompt(graph, FILES).valid


def test_the_stock_sd15_workflow() -> None:
    read = demand(txt2img(size=512))
    assert read.files == (ModelFile("checkpoints", SD15),)
    assert read.megapixels == 0.25
    assert read.key == SD15
    assert read.outputs == ("9",)
    assert (read.prompt_id, read.client_id, read.number, read.front) == (None, None, None, False)


def test_the_flux_workflow() -> None:
    read = demand(flux())
    assert read.files == FLUX_FILES
    assert read.megapixels == 1.0
    assert read.key == (
        "ae.safetensors+clip_l.safetensors+flux1-dev-fp8.safetensors+t5xxl_fp8_e4m3fn.safetensors"
    )


def test_the_key_does_not_depend_on_node_ids_or_order() -> None:
    graph = flux()
    renumbered = {f"n{k}": _relink(v, lambda i: f"n{i}") for k, v in graph.items()}
    shuffled = list(renumbered.items())
    random.Random(3).shuffle(shuffled)
    read = demand(dict(shuffled))
    assert (read.key, read.files) == (demand(graph).key, FLUX_FILES)


def _relink(node: dict[str, Any], rename: Any) -> dict[str, Any]:
    inputs = {
        k: [rename(v[0]), v[1]] if isinstance(v, list) else v for k, v in node["inputs"].items()
    }
    return {**node, "inputs": inputs}


def test_a_model_free_graph_loads_no_file() -> None:
    read = demand(blank())
    assert (read.files, read.megapixels, read.key) == ((), 0.0, NO_FILES_KEY)


def test_lora_controlnet_and_upscale_graphs() -> None:
    checkpoint = ModelFile("checkpoints", SD15)
    assert demand(lora()).files == (checkpoint, ModelFile("loras", LORA))
    assert demand(controlnet()).files == (checkpoint, ModelFile("controlnet", CONTROLNET))
    assert demand(upscale()).files == (checkpoint, ModelFile("upscale_models", UPSCALER))
    assert demand(lora()).key == f"{LORA}+{SD15}"


def test_only_what_the_outputs_need_counts() -> None:
    graph = txt2img()
    # A loader feeding nothing, and one feeding a text encoder no output uses: ComfyUI runs
    # neither, so neither loads.
    graph["20"] = {"class_type": "UNETLoader", "inputs": {"unet_name": "unused.safetensors"}}
    graph["21"] = {"class_type": "CLIPLoader", "inputs": {"clip_name": "x.safetensors"}}
    graph["22"] = {"class_type": "CLIPTextEncode", "inputs": {"text": "", "clip": ["21", 0]}}
    assert demand(graph).files == (ModelFile("checkpoints", SD15),)
    # A node of a class the gate does not know may be a custom output: what it needs counts.
    graph["23"] = {"class_type": "VHS_VideoCombine", "inputs": {"images": ["24", 0]}}
    graph["24"] = {"class_type": "VAELoader", "inputs": {"vae_name": "sdxl_vae.safetensors"}}
    read = demand(graph)
    assert read.files == (ModelFile("checkpoints", SD15), ModelFile("vae", "sdxl_vae.safetensors"))
    assert sorted(read.outputs) == ["23", "9"]


def test_partial_execution_targets_choose_the_outputs() -> None:
    graph = {**flux(), **{f"s{k}": v for k, v in txt2img().items()}}
    graph = {
        k: _relink(v, lambda i, k=k: f"s{i}" if k.startswith("s") else i) for k, v in graph.items()
    }
    assert demand(graph, partial_execution_targets=["s9"]).files == (
        ModelFile("checkpoints", SD15),
    )
    assert demand(graph, partial_execution_targets=["9"]).files == FLUX_FILES
    assert len(demand(graph).files) == 5
    assert read_prompt(body(graph, partial_execution_targets=[])) == Unreadable(
        "the prompt has no outputs"
    )


def test_the_largest_latent_of_any_size_and_batch() -> None:
    graph = txt2img()
    graph["5"]["inputs"] = {"width": 1024, "height": 1536, "batch_size": 4}
    graph["30"] = {
        "class_type": "EmptySD3LatentImage",
        "inputs": {"width": 2048, "height": 2048, "batch_size": 1},
    }
    graph["31"] = {"class_type": "PreviewImage", "inputs": {"images": ["30", 0]}}
    assert demand(graph).megapixels == 6.0
    graph["5"]["inputs"]["width"] = ["40", 0]  # from a primitive node: not known
    assert demand(graph).megapixels == 4.0


def test_a_file_name_given_by_a_link_is_a_file_without_a_name() -> None:
    graph = lora()
    graph["10"]["inputs"]["lora_name"] = ["50", 0]
    graph["50"] = {"class_type": "PrimitiveString", "inputs": {"value": LORA}}
    read = demand(graph)
    assert read.unnamed == (ModelFile("loras", None),)
    assert read.key == f"<loras>+{SD15}"


def test_a_taesd_decoder_is_not_a_vae_file() -> None:
    graph = flux()
    graph["3"]["inputs"]["vae_name"] = "taef1"
    assert ModelFile("vae_approx", "taef1") in demand(graph).files


def test_a_long_file_set_key_is_short_stable_and_distinct() -> None:
    names = [f"lora-{n:03}-with-a-long-descriptive-name.safetensors" for n in range(12)]
    files = [ModelFile("loras", n) for n in names]
    key = files_key(files)
    assert len(key) <= KEY_MAX and key.startswith(names[0] + "+11 more#")
    assert files_key(reversed(files)) == key
    assert files_key(files[:-1]) != key
    assert files_key([ModelFile("checkpoints", n) for n in names]) != key


def test_the_fields_comfyui_reads_besides_the_graph() -> None:
    read = demand(txt2img(), prompt_id="job-1", client_id="browser", front=True)
    assert (read.prompt_id, read.client_id, read.number, read.front) == (
        "job-1",
        "browser",
        None,
        True,
    )
    # ComfyUI takes str() of any prompt_id, float() of number, and front only without number.
    read = demand(txt2img(), prompt_id=7, number="2.5", front=True, client_id=3)
    assert (read.prompt_id, read.client_id, read.number, read.front) == ("7", None, 2.5, False)


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (b"", "the body is not JSON"),
        (b"{", "the body is not JSON"),
        (b"\xff{}", "the body is not UTF-8 text"),
        (b"[]", "the body is not a JSON object"),
        (b'"prompt"', "the body is not a JSON object"),
        (b"{}", "no prompt"),
        (b'{"client_id": "x"}', "no prompt"),
        (b'{"prompt": []}', "prompt is not an object"),
        (b'{"prompt": "graph"}', "prompt is not an object"),
        (b'{"prompt": null}', "prompt is not an object"),
        (b'{"prompt": {}}', "the prompt has no outputs"),
        (b'{"prompt": {"1": 5}}', "node '1' has no class_type"),
        (b'{"prompt": {"1": {"inputs": {}}}}', "node '1' has no class_type"),
        (b'{"prompt": {"1": {"class_type": ["SaveImage"]}}}', "node '1' has no class_type"),
        (
            b'{"prompt": {"1": {"class_type": "KSampler", "inputs": {}}}}',
            "the prompt has no outputs",
        ),
        (body(txt2img(), number="soon"), "number is not a number"),
        (body(txt2img(), number=None), "number is not a number"),
        (body(txt2img(), partial_execution_targets=5), "partial_execution_targets is not a list"),
    ],
)
def test_what_comfyui_refuses_itself_is_unreadable(raw: bytes, reason: str) -> None:
    assert read_prompt(raw) == Unreadable(reason)


def test_odd_nodes_inside_a_readable_graph_are_ignored() -> None:
    graph = txt2img()
    graph["9"]["inputs"]["images"] = ["404", 0]  # a link to no node
    graph["3"]["inputs"]["model"] = [4, 0]  # not a link: the id is not a string
    graph["60"] = {"class_type": "SaveImage"}  # no inputs at all
    graph["61"] = {"class_type": "SaveImage", "inputs": ["8", 0]}
    read = demand(graph)
    assert read.files == () and sorted(read.outputs) == ["60", "61", "9"]


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner),
    max_leaves=20,
)
CLASSES = st.sampled_from(
    ["CheckpointLoaderSimple", "UNETLoader", "DualCLIPLoader", "VAELoader", "LoraLoader",
     "KSampler", "EmptyLatentImage", "SaveImage", "PreviewImage", "Custom", "CLIPTextEncode"]
)  # fmt: skip
INPUT_NAMES = st.sampled_from(
    ["ckpt_name", "unet_name", "clip_name1", "clip_name2", "vae_name", "lora_name", "model",
     "width", "height", "batch_size", "images"]
)  # fmt: skip
IDS = st.sampled_from(["1", "2", "3", "4"])
INPUT_VALUES = st.one_of(
    JSON, st.tuples(IDS, st.integers(0, 3)).map(list), st.integers(-5, 5000), st.text(max_size=5)
)
NODES = st.fixed_dictionaries(
    {"class_type": CLASSES, "inputs": st.dictionaries(INPUT_NAMES, INPUT_VALUES, max_size=5)}
)
GRAPHS = st.dictionaries(IDS, NODES | JSON, max_size=4)
BODIES = st.one_of(
    st.binary(max_size=64),
    JSON.map(lambda v: json.dumps(v).encode()),
    st.fixed_dictionaries(
        {"prompt": GRAPHS},
        optional={"number": JSON, "front": JSON, "prompt_id": JSON, "client_id": JSON,
                  "partial_execution_targets": JSON},
    ).map(lambda v: json.dumps(v).encode()),
)  # fmt: skip


@settings(max_examples=400, deadline=None)
@given(BODIES)
def test_any_body_is_a_demand_or_unreadable_and_never_raises(raw: bytes) -> None:
    read = read_prompt(raw)
    assert isinstance(read, (PromptDemand, Unreadable))
    if isinstance(read, PromptDemand):
        assert read.outputs and read.megapixels >= 0
        assert read.key == files_key(read.files) and len(read.key) <= KEY_MAX
        assert list(read.files) == sorted(set(read.files), key=ModelFile.sort_key)


@pytest.mark.parametrize("depth", [901, 990, 1_000, 100_000])
def test_a_body_nested_past_what_both_can_read_is_too_deep(depth: int) -> None:
    # ComfyUI's json.loads fails somewhere near 1,000 levels, where exactly depends on its
    # own stack: the gate neither forwards such a body unread nor guesses.
    inner = b"[" * depth + b"]" * depth
    assert read_prompt(b'{"prompt": {}, "x": ' + inner + b"}") == TooDeep()
    assert read_prompt(b"[" * depth) == TooDeep()


def test_a_body_nested_within_the_bound_is_read() -> None:
    deep = b"[" * 850 + b"]" * 850
    demand = read_prompt(body(txt2img())[:-1] + b', "x": ' + deep + b"}")
    assert isinstance(demand, PromptDemand)


def test_brackets_inside_strings_do_not_count_as_nesting() -> None:
    text = '{"a": "' + "[" * 5000 + '\\"' + "{" * 5000 + '"}'
    assert nesting(text) == 1


@pytest.mark.parametrize(
    ("charset", "expected"),
    [
        (None, "utf-8"),
        ("latin-1", "latin-1"),
        ("utf-16", "utf-16"),
    ],
)
def test_the_body_is_read_in_its_content_types_charset(charset, expected) -> None:
    raw = json.dumps({"prompt": txt2img(), "client_id": "caf\u00e9"}).replace(
        "caf\\u00e9", "caf\u00e9"
    )
    demand = read_prompt(raw.encode(expected), charset)
    assert isinstance(demand, PromptDemand)
    assert demand.client_id == "caf\u00e9"


def test_a_charset_python_does_not_know_is_unreadable_as_comfyui_fails_on_it() -> None:
    assert read_prompt(body(txt2img()), "x-no-such") == Unreadable("the body is not x-no-such text")
