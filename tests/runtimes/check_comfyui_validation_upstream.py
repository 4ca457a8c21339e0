"""The gate's verdict against ComfyUI's own `validate_prompt`, run from ComfyUI's source.

Not part of the suite (its name is not test_*: ComfyUI's source cannot be installed from a
registry). Run it against a checkout, or a git directory of one (read at `HEAD`):

    COMFYUI_SOURCE=/path/to/ComfyUI .venv/bin/python -m pytest -q \
        tests/runtimes/check_comfyui_validation_upstream.py
 Only the functions validation runs are taken from
the source (`execution.validate_prompt`, `validate_inputs`, `full_type_name`,
`comfy_execution.graph.get_input_info`, `comfy_execution.validation.validate_node_input`);
node classes are built from the test's `/object_info` fixture, as INPUT_TYPES / RETURN_TYPES /
OUTPUT_NODE would declare them.

Upstream iterates sets of strings, whose order follows the process's string hashing. The
functions run here with `set` bound to an insertion-ordered set, so that upstream takes the
order the gate takes (outputs in prompt order, inputs in declaration order), and bodies can
be compared byte for byte.
"""

from __future__ import annotations

import ast
import asyncio
import copy
import inspect
import json
import logging
import os
import subprocess
import sys
import traceback
import typing
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest
from hypothesis import HealthCheck, given, settings

from gpugate.runtimes.comfyui.catalog import parse_object_info
from gpugate.runtimes.comfyui.validation import Outcome, validate
from tests.runtimes.test_comfyui_validation import object_info, txt2img
from tests.runtimes.test_comfyui_validation_agreement import mutated

SOURCE = os.environ.get("COMFYUI_SOURCE", "")
pytestmark = pytest.mark.skipif(not SOURCE, reason="COMFYUI_SOURCE is not set")


def _read(path: str) -> str:
    root = Path(SOURCE)
    if (root / path).is_file():
        return (root / path).read_text()
    return subprocess.run(
        ["git", "--git-dir", SOURCE, "show", f"HEAD:{path}"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout


def _functions(path: str, names: set[str]) -> str:
    """The source of the named top-level functions of one file."""
    tree = ast.parse(_read(path))
    picked = [
        node
        for node in tree.body
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name in names
    ]
    assert {n.name for n in picked} == names, f"{path} lacks some of {names}"
    return "\n\n".join(ast.unparse(n) for n in picked)


class OrderedSet:
    """The part of `set` upstream validation uses, iterating in insertion order."""

    def __init__(self, items: Iterable[Any] = ()) -> None:
        self._items = dict.fromkeys(items)

    def add(self, item: Any) -> None:
        self._items[item] = None

    def union(self, other: Iterable[Any]) -> OrderedSet:
        return OrderedSet([*self._items, *other])

    def __contains__(self, item: Any) -> bool:
        return item in self._items

    def __iter__(self) -> Iterator[Any]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)


class _Nodes:
    NODE_CLASS_MAPPINGS: ClassVar[dict[str, type]] = {}


class _ComfyNodeInternal:
    pass


def _node_class(name: str, info: dict[str, Any]) -> type:
    declared = {
        group: {k: tuple(v) if isinstance(v, list) else v for k, v in inputs.items()}
        for group, inputs in info["input"].items()
    }
    attrs: dict[str, Any] = {
        "INPUT_TYPES": classmethod(lambda cls: copy.deepcopy(declared)),
        "RETURN_TYPES": tuple(info["output"]),
    }
    if info.get("output_node"):
        attrs["OUTPUT_NODE"] = True
    return type(name, (), attrs)


def _quiet_logger() -> logging.Logger:
    logger = logging.getLogger("comfyui-upstream")
    logger.addHandler(logging.NullHandler())
    logger.propagate = False
    return logger


def _upstream() -> Callable[..., Any]:
    namespace: dict[str, Any] = {
        "__name__": "execution",
        "set": OrderedSet,
        "nodes": _Nodes,
        "inspect": inspect,
        "logging": _quiet_logger(),
        "sys": sys,
        "traceback": traceback,
        "Union": typing.Union,
        "_ComfyNodeInternal": _ComfyNodeInternal,
        "first_real_override": lambda cls, name: None,
    }
    # validate_node_input compares sets of type names: it keeps the real `set`.
    types: dict[str, Any] = {"__name__": "comfy_execution.validation"}
    exec(_read("comfy_execution/validation.py"), types)
    namespace["validate_node_input"] = types["validate_node_input"]
    exec(_functions("comfy_execution/graph.py", {"get_input_info"}), namespace)
    wanted = {"validate_inputs", "validate_prompt", "full_type_name"}
    exec(_functions("execution.py", wanted), namespace)
    return namespace["validate_prompt"]


# Classes whose validation the catalog describes (no validation code, no custom pack).
INFO = {
    name: info
    for name, info in object_info().items()
    if not parse_object_info({name: info}).nodes[name].by_code
}
CATALOG = parse_object_info(INFO)


@pytest.fixture(scope="module")
def upstream() -> Callable[..., Any]:
    _Nodes.NODE_CLASS_MAPPINGS = {name: _node_class(name, info) for name, info in INFO.items()}
    return _upstream()


def _no_tracebacks(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: [] if k == "traceback" else _no_tracebacks(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_no_tracebacks(v) for v in value]
    return value


def check(upstream: Callable[..., Any], prompt: Any, targets: Any = None) -> Outcome:
    verdict = validate(copy.deepcopy(prompt), CATALOG, targets)
    try:
        valid, error, _, node_errors = asyncio.run(upstream("id", copy.deepcopy(prompt), targets))
    except Exception:
        # post_prompt does not catch: aiohttp answers 500.
        assert verdict.outcome is Outcome.UNKNOWN, verdict
        return verdict.outcome
    if verdict.outcome is Outcome.UNKNOWN:
        # A cycle; or a `*` type, which matches anything when the class declares it as one of
        # ComfyUI's IO types (a str overriding `__ne__`), and here is a plain string.
        assert verdict.reason == "the graph has a cycle" or "*" in verdict.reason, verdict
        return verdict.outcome
    if valid:
        assert verdict.outcome is Outcome.QUEUE, (verdict, node_errors)
    else:
        assert verdict.outcome is Outcome.REFUSE, (verdict, error)
        expected = _no_tracebacks({"error": error, "node_errors": node_errors})
        assert verdict.body == json.dumps(expected).encode()
    got = [(f.node_id, f.class_type, f.errors) for f in verdict.failures]
    assert got == [
        (i, e["class_type"], tuple(r["type"] for r in e["errors"])) for i, e in node_errors.items()
    ]
    return verdict.outcome


def flux_graph() -> dict[str, Any]:
    return {
        "1": {"class_type": "UNETLoader",
              "inputs": {"unet_name": "flux1-dev-fp8.safetensors", "weight_dtype": "default"}},
        "2": {"class_type": "DualCLIPLoader",
              "inputs": {"clip_name1": "t5xxl_fp8_e4m3fn.safetensors",
                         "clip_name2": "clip_l.safetensors", "type": "flux"}},
        "3": {"class_type": "VAELoader", "inputs": {"vae_name": "ae.safetensors"}},
        "4": {"class_type": "CLIPTextEncode", "inputs": {"text": "a fox", "clip": ["2", 0]}},
        "6": {"class_type": "EmptyLatentImage",
              "inputs": {"width": 1024, "height": 1024, "batch_size": 1}},
        "7": {"class_type": "KSampler",
              "inputs": {"model": ["1", 0], "seed": 7, "steps": 4, "cfg": 1.0,
                         "sampler_name": "euler", "scheduler": "simple", "positive": ["4", 0],
                         "negative": ["4", 0], "latent_image": ["6", 0], "denoise": 1.0}},
        "8": {"class_type": "VAEDecode", "inputs": {"samples": ["7", 0], "vae": ["3", 0]}},
        "9": {"class_type": "SaveImage", "inputs": {"images": ["8", 0], "filename_prefix": "f"}},
        "10": {"class_type": "CreateVideo", "inputs": {"images": ["8", 0], "fps": 24}},
        "11": {"class_type": "SaveVideo",
               "inputs": {"video": ["10", 0], "filename_prefix": "v", "format": "auto",
                          "codec": "auto"}},
    }  # fmt: skip


CASES = mutated(
    [txt2img(), flux_graph()],
    {name: [i.name for i in n.validated_inputs] for name, n in CATALOG.nodes.items()},
)


@settings(max_examples=800, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(CASES)
def test_gate_agrees_with_comfyui_source(
    upstream: Callable[..., Any], case: tuple[dict[str, Any], Any]
) -> None:
    prompt, targets = case
    check(upstream, prompt, targets)


def test_named_refusals_agree_with_comfyui_source(upstream: Callable[..., Any]) -> None:
    edits: list[Callable[[dict[str, Any]], Any]] = [
        lambda p: p["4"]["inputs"].update(ckpt_name="missing.safetensors"),
        lambda p: p["3"]["inputs"].pop("seed"),
        lambda p: p["3"]["inputs"].update(model=["4", 0, 0]),
        lambda p: p["3"]["inputs"].update(model=["4", 1]),
        lambda p: p["3"]["inputs"].update(steps=0.5, cfg="high", sampler_name="x"),
        lambda p: p["5"]["inputs"].update(width=99999),
        lambda p: p["9"]["inputs"].update(images=["42", 0]),
        lambda p: p["8"]["inputs"].update(samples=["3", 3]),
        lambda p: p["5"].update(class_type="Unknown"),
        lambda p: p.pop("9"),
        lambda p: p.update({"10": {"class_type": "PreviewImage", "inputs": {}}}),
    ]
    outcomes = []
    for edit in edits:
        prompt = txt2img()
        edit(prompt)
        outcomes.append(check(upstream, prompt))
    assert outcomes == [Outcome.REFUSE] * (len(edits) - 1) + [Outcome.QUEUE]
