"""The gate's verdict agrees with the simulated ComfyUI's own validation, on generated prompts.

The simulator validates in-process (`gpugate_sim.comfyui.validation.validate_prompt`); the gate
reads a catalog built the way `/object_info` describes the simulator's node classes. On each
prompt: the simulator raising (ComfyUI's 500) means the gate does not decide; the simulator
refusing means the gate refuses with the same body (tracebacks aside, which only the server
can write); the simulator queueing means the gate does not refuse, and both report the same
node errors.
"""

from __future__ import annotations

import copy
import json
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpugate.runtimes.comfyui.catalog import Catalog, parse_object_info
from gpugate.runtimes.comfyui.validation import Outcome, Verdict, validate
from gpugate_sim.comfyui.nodes import NODES, InputDef
from gpugate_sim.comfyui.validation import validate_node_input, validate_prompt
from tests.sim.comfyui_helpers import MODELS, blank, flux, txt2img

FILES: dict[str, list[str]] = {}
for _model in MODELS:
    FILES.setdefault(_model.folder, []).append(_model.name)
for _names in FILES.values():
    _names.sort()


def sim_object_info(files: dict[str, list[str]]) -> dict[str, Any]:
    """`/object_info` for the simulator's classes, as server.py's `node_info` shapes it."""

    def group(specs: list[InputDef]) -> dict[str, Any]:
        return {spec.name: spec.config(files) for spec in specs}

    info = {}
    for name, node in NODES.items():
        inputs = {"required": group([i for i in node.inputs if i.required])}
        optional = [i for i in node.inputs if not i.required]
        if optional:
            inputs["optional"] = group(optional)
        info[name] = {
            "input": inputs,
            "output": list(node.outputs),
            "name": name,
            "python_module": "nodes",
            "output_node": node.output_node,
        }
    return json.loads(json.dumps(info))


CATALOG: Catalog = parse_object_info(sim_object_info(FILES))
CLASSES = sorted(NODES)


def _no_tracebacks(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: [] if k == "traceback" else _no_tracebacks(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_no_tracebacks(v) for v in value]
    return value


def _failures(node_errors: dict[str, Any]) -> list[tuple[str, str, tuple[str, ...]]]:
    return [
        (str(i), str(e["class_type"]), tuple(r["type"] for r in e["errors"]))
        for i, e in node_errors.items()
    ]


def check_agreement(prompt: Any, targets: Any = None) -> Verdict:
    verdict = validate(copy.deepcopy(prompt), CATALOG, targets)
    # What the catalog keeps made once per class is only read: the same prompt again,
    # after every earlier one, gets the same verdict.
    assert validate(copy.deepcopy(prompt), CATALOG, targets) == verdict
    try:
        sim = validate_prompt(copy.deepcopy(prompt), FILES, targets)
    except Exception:
        assert verdict.outcome is Outcome.UNKNOWN, verdict
        return verdict
    if verdict.outcome is Outcome.UNKNOWN:
        # With only catalog-described classes, the one thing left undecided is a cycle.
        assert verdict.reason == "the graph has a cycle", verdict
        return verdict
    if not sim.valid:
        assert verdict.outcome is Outcome.REFUSE, (verdict, sim)
        expected = {"error": sim.error, "node_errors": sim.node_errors}
        assert json.loads(verdict.body) == _no_tracebacks(expected)
        assert verdict.body == json.dumps(_no_tracebacks(expected)).encode()
        assert verdict.exact == ("traceback" not in json.dumps(expected))
    else:
        assert verdict.outcome is Outcome.QUEUE, (verdict, sim)
    assert [(f.node_id, f.class_type, f.errors) for f in verdict.failures] == _failures(
        sim.node_errors
    )
    return verdict


# -- generated prompts ------------------------------------------------------------------------

FILE_NAMES = sorted({m.name for m in MODELS})
values = st.one_of(
    st.integers(min_value=-(2**65), max_value=2**65),
    st.sampled_from([0, 1, 8, 16, 512, 16384, 16385, 4097, 0xFFFFFFFFFFFFFFFF + 1, -1, 99999]),
    st.floats(allow_nan=False, allow_infinity=False, width=32),
    st.sampled_from([0.5, 1.0, 100.5, -100.01, 3.5]),
    st.booleans(),
    st.none(),
    st.text(max_size=6),
    st.sampled_from(["12", "1.5", "euler", "normal", "flux", "default", "x.safetensors"]),
    st.sampled_from(FILE_NAMES),
    st.dictionaries(st.sampled_from(["__value__", "a"]), st.integers(0, 30), max_size=2),
)


def links(node_ids: list[str]) -> st.SearchStrategy[list[Any]]:
    slot = st.one_of(st.integers(-4, 4), st.sampled_from([0.0, "0", None, True]))
    target = st.one_of(st.sampled_from(node_ids), st.sampled_from(["99", "", 3]))
    return st.one_of(
        st.tuples(target, slot).map(list),
        st.lists(st.sampled_from(node_ids), min_size=0, max_size=3),
    )


def mutated(
    bases: list[dict[str, Any]], input_names: dict[str, list[str]]
) -> st.SearchStrategy[tuple[dict[str, Any], Any]]:
    """Prompts made from `bases` by a few edits, and `partial_execution_targets` for them."""
    classes = sorted(input_names)

    @st.composite
    def draw_case(draw: st.DrawFn) -> tuple[dict[str, Any], Any]:
        prompt = copy.deepcopy(draw(st.sampled_from(bases)))
        for _ in range(draw(st.integers(0, 4))):
            ids = sorted(prompt)
            if not ids:
                break
            op = draw(st.sampled_from(["value", "link", "drop", "class", "add", "remove", "odd"]))
            node_id = draw(st.sampled_from(ids))
            node = prompt[node_id]
            if not isinstance(node, dict) or not isinstance(node.get("inputs"), dict):
                continue
            class_type = node.get("class_type")
            names = input_names.get(class_type, []) if isinstance(class_type, str) else []
            if op in ("value", "link", "drop") and names:
                name = draw(st.sampled_from([*names, "extra"]))
                if op == "value":
                    node["inputs"][name] = draw(values)
                elif op == "link":
                    node["inputs"][name] = draw(links(ids))
                else:
                    node["inputs"].pop(name, None)
            elif op == "class":
                choice = draw(st.sampled_from([*classes, "NoSuchNode", None]))
                if choice is None:
                    node.pop("class_type", None)
                else:
                    node["class_type"] = choice
            elif op == "add":
                added = draw(st.sampled_from(classes))
                prompt[str(100 + len(prompt))] = {
                    "class_type": added,
                    "inputs": {n: draw(st.one_of(values, links(ids))) for n in input_names[added]},
                }
            elif op == "remove":
                del prompt[node_id]
            elif op == "odd":
                # Shapes ComfyUI answers with a 500, or refuses before looking at nodes.
                prompt[node_id] = draw(
                    st.sampled_from(
                        [5, "class_type", "other", ["class_type"], {"class_type": ["x"]},
                         {"class_type": "SaveImage"}, {"class_type": "VAEDecode", "inputs": []},
                         {"class_type": "SaveImage", "inputs": None}]
                    )
                )  # fmt: skip
        some_targets = st.lists(st.sampled_from([*sorted(prompt), "9"]))
        targets = draw(st.one_of(st.none(), st.none(), st.none(), some_targets, st.just(7)))
        return prompt, targets

    return draw_case()


SIM_CASES = mutated(
    [txt2img(), flux(), blank()], {name: [i.name for i in n.inputs] for name, n in NODES.items()}
)


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(SIM_CASES)
def test_gate_agrees_with_the_simulated_comfyui(case: tuple[dict[str, Any], Any]) -> None:
    prompt, targets = case
    check_agreement(prompt, targets)


# -- named cases, so that each kind of refusal is surely covered ------------------------------


def test_agreement_on_each_error_kind() -> None:
    seen: set[str] = set()
    cases: list[dict[str, Any]] = []
    base = txt2img()
    for mutate in (
        lambda p: p["4"]["inputs"].update(ckpt_name="missing.safetensors"),
        lambda p: p["3"]["inputs"].pop("seed"),
        lambda p: p["3"]["inputs"].update(model=["4", 0, 0]),
        lambda p: p["3"]["inputs"].update(model=["4", 1]),
        lambda p: p["3"]["inputs"].update(steps=0),
        lambda p: p["5"]["inputs"].update(width=99999),
        lambda p: p["3"]["inputs"].update(cfg="high"),
        lambda p: p["3"]["inputs"].update(sampler_name="nope"),
        lambda p: p["9"]["inputs"].update(images=["42", 0]),
        lambda p: p["8"]["inputs"].update(samples=["3", 3]),
        lambda p: p["5"].update(class_type="Unknown"),
        lambda p: p.pop("9"),
    ):
        prompt = copy.deepcopy(base)
        mutate(prompt)
        cases.append(prompt)
    for prompt in cases:
        verdict = check_agreement(prompt)
        assert verdict.outcome is Outcome.REFUSE
        seen.add(verdict.error_type)
        seen.update(e for f in verdict.failures for e in f.errors)
    assert seen == {
        "prompt_outputs_failed_validation", "invalid_prompt", "prompt_no_outputs",
        "value_not_in_list", "required_input_missing", "bad_linked_input",
        "return_type_mismatch", "value_smaller_than_min", "value_bigger_than_max",
        "invalid_input_type", "exception_during_validation", "exception_during_inner_validation",
    }  # fmt: skip


def test_a_file_name_that_is_not_a_string_fails_inside_the_nodes_own_check() -> None:
    # folder_paths.annotated_filepath calls `name.endswith`: an int raises there, so
    # LoadImage's VALIDATE_INPUTS fails with the exception, not "Invalid image file: 0".
    prompt = blank()
    prompt["1"] = {"class_type": "LoadImage", "inputs": {"image": 0}}
    verdict = check_agreement(prompt)
    assert verdict.outcome is Outcome.REFUSE
    (failure,) = verdict.failures
    assert failure.errors == ("exception_during_inner_validation",)


def test_agreement_on_a_partly_valid_prompt() -> None:
    prompt = txt2img()
    prompt["10"] = {"class_type": "PreviewImage", "inputs": {"images": ["8", 5]}}
    assert check_agreement(prompt).outcome is Outcome.QUEUE


def test_simulator_matches_link_types_as_comfyui_does() -> None:
    # comfy_execution/validation.py: unions "T1,T2" match when they share a type.
    assert validate_node_input("FLOAT", "FLOAT,INT")
    assert validate_node_input("INT, STRING", "STRING")
    assert not validate_node_input("LATENT", "IMAGE")
    assert not validate_node_input("STRING", ["a", "b"])
    assert validate_node_input(["a", "b"], ["a", "b"])
