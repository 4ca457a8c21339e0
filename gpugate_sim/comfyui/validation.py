"""`validate_prompt` as ComfyUI's execution.py does it, with its error shapes.

The code keeps the upstream's order of operations on purpose: a prompt that makes the
real one raise (a list where a mapping is expected, a link to a node that does not
exist) raises here at the same point, and turns into the same answer — a 500 from the
route, or an `exception_during_validation` reason for the output being validated.
"""

from __future__ import annotations

import os
import traceback
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import attrs

from gpugate_sim.comfyui.nodes import NODES, InputDef, NodeDef

Reason = dict[str, Any]


@attrs.frozen
class Validation:
    """What validate_prompt returns: `(valid, error, outputs, node_errors)` upstream."""

    valid: bool
    error: Reason | None
    outputs: list[str]
    node_errors: dict[str, Any]


def _error(kind: str, message: str, details: str, extra: Mapping[str, Any]) -> Reason:
    return {"type": kind, "message": message, "details": details, "extra_info": dict(extra)}


def full_type_name(kind: type) -> str:
    """`module.QualName` as ComfyUI names exception types (builtins without a module)."""
    module = kind.__module__
    return kind.__qualname__ if module in (None, "builtins") else f"{module}.{kind.__qualname__}"


def validate_node_input(received_type: Any, input_type: Any) -> bool:
    """comfy_execution/validation.py: equal, or "T1,T2" unions that share a type."""
    if received_type == input_type:
        return True
    if not isinstance(received_type, str) or not isinstance(input_type, str):
        return False
    received = {t.strip() for t in received_type.split(",")}
    wanted = {t.strip() for t in input_type.split(",")}
    return len(received & wanted) > 0


def _is_link(value: Any) -> bool:
    """comfy_execution/graph_utils.py `is_link`."""
    return (
        isinstance(value, list)
        and len(value) == 2
        and isinstance(value[0], str)
        and isinstance(value[1], (int, float))
    )


def annotated_exists(folders: Mapping[str, Path]) -> Callable[[str], bool]:
    """folder_paths.py `exists_annotated_filepath` over these input, output and temp
    folders: `os.path.exists` of the name joined to the folder its annotation names (the
    input folder without one). A directory exists too."""

    def exists(name: str) -> bool:
        name, folder = _annotated(name)
        return os.path.exists(os.path.join(folders[folder or "input"], name))

    return exists


def _annotated(name: str) -> tuple[str, str | None]:
    """folder_paths.py `annotated_filepath`: it reads the name with `str.endswith`, so a
    value that is not a string (`"image": 0`) raises AttributeError there, before any file
    is looked for, and the node's validation fails with that exception."""
    for folder in ("output", "input", "temp"):
        if name.endswith(f"[{folder}]"):
            return name[: -(len(folder) + 3)], folder
    return name, None


def _nothing_exists(name: str) -> bool:
    _annotated(name)
    return False


class _Validator:
    def __init__(
        self,
        prompt: Any,
        files: Mapping[str, list[str]],
        nodes: Mapping[str, NodeDef] = NODES,
        exists: Callable[[str], bool] = _nothing_exists,
    ) -> None:
        self.prompt = prompt
        self.files = files
        self.nodes = nodes
        self.exists = exists
        self.validated: dict[Any, tuple[bool, list[Reason], Any]] = {}

    def info(self, spec: InputDef) -> list[Any]:
        return spec.info(self.files)

    def inputs(self, unique_id: Any) -> tuple[bool, list[Reason], Any]:
        if unique_id in self.validated:
            return self.validated[unique_id]
        inputs = self.prompt[unique_id]["inputs"]
        node = self.nodes[self.prompt[unique_id]["class_type"]]
        checked = node.validate.args if node.validate is not None else ()
        errors: list[Reason] = []
        valid = True
        for spec in node.inputs:
            x = spec.name
            if x not in inputs:
                if spec.required:
                    errors.append(
                        _error(
                            "required_input_missing",
                            "Required input is missing",
                            x,
                            {"input_name": x},
                        )
                    )
                continue
            val = inputs[x]
            info = self.info(spec)
            if isinstance(val, list):
                if len(val) != 2:
                    errors.append(
                        _error(
                            "bad_linked_input",
                            "Bad linked input, must be a length-2 list of [node_id, slot_index]",
                            x,
                            {"input_name": x, "input_config": info, "received_value": val},
                        )
                    )
                    continue
                o_id = val[0]
                received = self.nodes[self.prompt[o_id]["class_type"]].outputs[val[1]]
                if not validate_node_input(received, info[0]):
                    details = f"{x}, received_type({received}) mismatch input_type({info[0]})"
                    errors.append(
                        _error(
                            "return_type_mismatch",
                            "Return type mismatch between linked nodes",
                            details,
                            {
                                "input_name": x,
                                "input_config": info,
                                "received_type": received,
                                "linked_node": val,
                            },
                        )
                    )
                    continue
                try:
                    if self.inputs(o_id)[0] is False:
                        valid = False
                        continue
                except Exception as ex:
                    valid = False
                    self.validated[o_id] = (
                        False,
                        [
                            _error(
                                "exception_during_inner_validation",
                                "Exception when validating inner node",
                                str(ex),
                                {
                                    "input_name": x,
                                    "input_config": info,
                                    "exception_message": str(ex),
                                    "exception_type": full_type_name(type(ex)),
                                    "traceback": traceback.format_tb(ex.__traceback__),
                                    "linked_node": val,
                                },
                            )
                        ],
                        o_id,
                    )
                    continue
                continue
            if spec.is_link:
                # A literal where a link is expected: upstream only checks its type later.
                continue
            try:
                if isinstance(val, dict) and "__value__" in val:
                    val = val["__value__"]
                    inputs[x] = val
                converters = {"INT": int, "FLOAT": float, "STRING": str, "BOOLEAN": bool}
                if spec.type in converters:
                    val = converters[spec.type](val)
                    inputs[x] = val
            except Exception as ex:
                errors.append(
                    _error(
                        "invalid_input_type",
                        f"Failed to convert an input value to a {spec.type} value",
                        f"{x}, {val}, {ex}",
                        {
                            "input_name": x,
                            "input_config": info,
                            "received_value": val,
                            "exception_message": str(ex),
                        },
                    )
                )
                continue
            if x in checked:
                # An argument of VALIDATE_INPUTS: it judges the value itself.
                continue
            options = spec.options
            extra = {"input_name": x, "input_config": info, "received_value": val}
            if "min" in options and val < options["min"]:
                errors.append(
                    _error(
                        "value_smaller_than_min",
                        f"Value {val} smaller than min of {options['min']}",
                        x,
                        extra,
                    )
                )
                continue
            if "max" in options and val > options["max"]:
                errors.append(
                    _error(
                        "value_bigger_than_max",
                        f"Value {val} bigger than max of {options['max']}",
                        x,
                        extra,
                    )
                )
                continue
            # Only a V1 combo is a list of values; a V3 combo's values go unchecked upstream.
            if spec.is_list:
                combo = info[0]
                if val not in combo:
                    config: Any = info
                    listed = str(combo)
                    # Upstream does not send back long lists, such as many model files.
                    if len(combo) > 20:
                        listed, config = f"(list of length {len(combo)})", None
                    errors.append(
                        _error(
                            "value_not_in_list",
                            "Value not in list",
                            f"{x}: '{val}' not in {listed}",
                            {"input_name": x, "input_config": config, "received_value": val},
                        )
                    )
                    continue
        if node.validate is not None:
            errors.extend(self._validate_inputs(node, inputs))
        result = (False, errors, unique_id) if errors or not valid else (True, [], unique_id)
        self.validated[unique_id] = result
        return result

    def _validate_inputs(self, node: NodeDef, inputs: Mapping[str, Any]) -> list[Reason]:
        """The class's VALIDATE_INPUTS, called as execution.py calls it: with the inputs
        it names that the prompt gives (get_input_data: None for a link), anything but True
        an error for each of them. A missing argument raises Python's TypeError."""
        check = node.validate
        assert check is not None
        given = {}
        for x, val in inputs.items():
            if node.input(x) is not None and x in check.args:
                given[x] = None if _is_link(val) else val
        missing = [x for x in check.args if x not in given]
        if missing:
            raise TypeError(
                f"{check.function}() missing 1 required positional argument: '{missing[0]}'"
            )
        verdict = check.judge(given, self.exists)
        if verdict is True:
            return []
        errors = []
        for x in given:
            details = x if verdict is False else f"{x} - {verdict}"
            errors.append(
                _error(
                    "custom_validation_failed",
                    "Custom validation failed for node",
                    details,
                    {"input_name": x},
                )
            )
        return errors


def validate_prompt(
    prompt: Any,
    files: Mapping[str, list[str]],
    partial_targets: Any = None,
    *,
    nodes: Mapping[str, NodeDef] = NODES,
    exists: Callable[[str], bool] = _nothing_exists,
) -> Validation:
    """Validate an API-format graph; exceptions upstream would raise propagate (a 500).

    `nodes`: the classes ComfyUI has; `exists`: folder_paths `exists_annotated_filepath`.
    A cycle recurses until Python's recursion limit, as upstream's recursion does: the
    RecursionError is an exception of an inner node, every node round the cycle invalid.
    """
    outputs: dict[Any, None] = {}
    for x in prompt:
        if "class_type" not in prompt[x]:
            return Validation(
                False,
                _error(
                    "invalid_prompt",
                    "Cannot execute because a node is missing the class_type property.",
                    f"Node ID '#{x}'",
                    {},
                ),
                [],
                {},
            )
        class_type = prompt[x]["class_type"]
        node = nodes.get(class_type)
        if node is None:
            return Validation(
                False,
                _error(
                    "invalid_prompt",
                    f"Cannot execute because node {class_type} does not exist.",
                    f"Node ID '#{x}'",
                    {},
                ),
                [],
                {},
            )
        if node.output_node and (partial_targets is None or x in partial_targets):
            outputs[x] = None
    if not outputs:
        return Validation(
            False, _error("prompt_no_outputs", "Prompt has no outputs", "", {}), [], {}
        )
    validator = _Validator(prompt, files, nodes, exists)
    good: list[Any] = []
    failed: list[tuple[Any, list[Reason]]] = []
    node_errors: dict[Any, Any] = {}
    for o in outputs:
        try:
            valid, reasons, _ = validator.inputs(o)
        except Exception as ex:
            valid = False
            reasons = [
                _error(
                    "exception_during_validation",
                    "Exception when validating node",
                    str(ex),
                    {
                        "exception_type": full_type_name(type(ex)),
                        "traceback": traceback.format_tb(ex.__traceback__),
                    },
                )
            ]
            validator.validated[o] = (False, reasons, o)
        if valid is True:
            good.append(o)
            continue
        failed.append((o, reasons))
        for node_id, (ok, why, _) in validator.validated.items():
            # Nodes downstream of a failed one are invalid without reasons: not reported.
            if ok is not True and why:
                if node_id not in node_errors:
                    node_errors[node_id] = {
                        "errors": why,
                        "dependent_outputs": [],
                        "class_type": prompt[node_id]["class_type"],
                    }
                node_errors[node_id]["dependent_outputs"].append(o)
    if not good:
        details = "\n".join(
            f"{e['message']}: {e['details']}" for _, errors in failed for e in errors
        )
        error = _error(
            "prompt_outputs_failed_validation", "Prompt outputs failed validation", details, {}
        )
        return Validation(False, error, [], node_errors)
    return Validation(True, None, good, node_errors)
