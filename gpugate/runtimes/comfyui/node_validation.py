"""ComfyUI 0.3.64's `execution.validate_inputs`: one node's inputs, and the nodes they link to.

Part of `comfyui_validation`, which explains the approach; kept apart for size.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpugate.runtimes.comfyui.catalog import Catalog, Category, InputKind, InputSpec, NodeSpec

MAX_DEPTH = 200
"""Links followed in one chain before giving up: ComfyUI's own recursion has a limit too."""

Reason = dict[str, Any]
"""One error as ComfyUI writes it into the body (JSON, echoed verbatim)."""


class CannotTell(BaseException):
    """Raised where the answer needs what the catalog lacks.

    A BaseException on purpose: the `except Exception` blocks copied from ComfyUI must not
    turn it into one of ComfyUI's own exception reasons.
    """

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def reason(kind: str, message: str, details: str, extra: Mapping[str, Any]) -> Reason:
    return {"type": kind, "message": message, "details": details, "extra_info": dict(extra)}


def full_type_name(klass: type) -> str:
    """execution.full_type_name: `module.QualName`, builtins without their module."""
    module = klass.__module__
    if module == "builtins":
        return klass.__qualname__
    return module + "." + klass.__qualname__


def _thaw(value: Any) -> Any:
    """A catalog tuple back to the JSON list ComfyUI holds."""
    return [_thaw(v) for v in value] if isinstance(value, tuple) else value


def types_match(received_type: Any, input_type: Any) -> bool:
    """comfy_execution/validation.py `validate_node_input`, for plain strings and lists."""
    # Upstream writes `not received_type != input_type` for str types overriding `__ne__`;
    # the catalog holds plain strings and lists, for which this is the same.
    if received_type == input_type:
        return True
    if not isinstance(received_type, str) or not isinstance(input_type, str):
        return False
    received = {t.strip() for t in received_type.split(",")}
    wanted = {t.strip() for t in input_type.split(",")}
    return len(received & wanted) > 0


class Validator:
    """`validate_inputs` with its `validated` memo, over one prompt and catalog."""

    def __init__(self, prompt: Mapping[Any, Any], catalog: Catalog) -> None:
        self.prompt = prompt
        self.catalog = catalog
        self.validated: dict[Any, tuple[bool, list[Reason], Any]] = {}
        self.active: list[Any] = []
        self.tracebacks = False

    def spec(self, class_type: Any) -> NodeSpec:
        spec = self.catalog.get(class_type)
        # validate_prompt has checked every node's class_type exists.
        assert spec is not None
        return spec

    def inputs(self, unique_id: Any) -> tuple[bool, list[Reason], Any]:
        if unique_id in self.validated:
            return self.validated[unique_id]
        if unique_id in self.active:
            # ComfyUI recurses until Python's limit; what it then reports is not worth copying.
            raise CannotTell("the graph has a cycle")
        if len(self.active) >= MAX_DEPTH:
            raise CannotTell(f"a chain of links deeper than {MAX_DEPTH}")
        self.active.append(unique_id)
        try:
            return self._inputs(unique_id)
        finally:
            self.active.pop()

    def _inputs(self, unique_id: Any) -> tuple[bool, list[Reason], Any]:
        inputs = self.prompt[unique_id]["inputs"]
        class_type = self.prompt[unique_id]["class_type"]
        node = self.spec(class_type)
        if node.by_code:
            raise CannotTell(f"{class_type} validates by code")
        errors: list[Reason] = []
        valid = True
        for spec in node.validated_inputs:
            x = spec.name
            if x not in inputs:
                if spec.category is Category.REQUIRED:
                    errors.append(
                        reason(
                            "required_input_missing",
                            "Required input is missing",
                            f"{x}",
                            {"input_name": x},
                        )
                    )
                continue
            val = inputs[x]
            info = spec.config
            if isinstance(val, list):
                outcome = self._link(spec, val, info, errors)
                if outcome is False:
                    valid = False
                continue
            error = self._literal(spec, val, info)
            if error is not None:
                errors.append(error)
        ret = (False, errors, unique_id) if errors or valid is not True else (True, [], unique_id)
        self.validated[unique_id] = ret
        return ret

    def _link(self, spec: InputSpec, val: list[Any], info: list[Any], errors: list[Reason]) -> bool:
        """A `[node_id, slot]` input; False when the linked node is invalid."""
        x = spec.name
        if len(val) != 2:
            errors.append(
                reason(
                    "bad_linked_input",
                    "Bad linked input, must be a length-2 list of [node_id, slot_index]",
                    f"{x}",
                    {"input_name": x, "input_config": info, "received_value": val},
                )
            )
            return True
        o_id = val[0]
        o_class_type = self.prompt[o_id]["class_type"]
        # RETURN_TYPES is a tuple in ComfyUI's own v1 classes: same IndexError text.
        linked = self.spec(o_class_type)
        r = linked.outputs
        received_type = _thaw(r[val[1]])
        if linked.by_code:
            # Its output type may be a str whose `__ne__` matches more than its text, and
            # validating it runs its own code.
            raise CannotTell(f"{x} links to {o_class_type}, which validates by code")
        input_type = spec.input_type
        if not types_match(received_type, input_type):
            if received_type == "*" or input_type == "*":
                # ComfyUI's IO types match `*` through `__ne__`; a plain string does not.
                raise CannotTell(f"{x} links {received_type} to {input_type}")
            details = f"{x}, received_type({received_type}) mismatch input_type({input_type})"
            errors.append(
                reason(
                    "return_type_mismatch",
                    "Return type mismatch between linked nodes",
                    details,
                    {
                        "input_name": x,
                        "input_config": info,
                        "received_type": received_type,
                        "linked_node": val,
                    },
                )
            )
            return True
        try:
            if self.inputs(o_id)[0] is False:
                return False
        except Exception as ex:
            self.tracebacks = True
            self.validated[o_id] = (
                False,
                [
                    reason(
                        "exception_during_inner_validation",
                        "Exception when validating inner node",
                        str(ex),
                        {
                            "input_name": x,
                            "input_config": info,
                            "exception_message": str(ex),
                            "exception_type": full_type_name(type(ex)),
                            "traceback": [],
                            "linked_node": val,
                        },
                    )
                ],
                o_id,
            )
            return False
        return True

    def _literal(self, spec: InputSpec, val: Any, info: list[Any]) -> Reason | None:
        """A literal value: converted, then checked against min, max and the value list."""
        x = spec.name
        input_type = spec.input_type
        try:
            # `{"__value__": v}` passes a list as a literal rather than as a link.
            if isinstance(val, dict) and "__value__" in val:
                val = val["__value__"]
            if spec.kind is InputKind.INT:
                val = int(val)
            if spec.kind is InputKind.FLOAT:
                val = float(val)
            if spec.kind is InputKind.STRING:
                val = str(val)
            if spec.kind is InputKind.BOOLEAN:
                val = bool(val)
        except Exception as ex:
            return reason(
                "invalid_input_type",
                f"Failed to convert an input value to a {input_type} value",
                f"{x}, {val}, {ex}",
                {
                    "input_name": x,
                    "input_config": info,
                    "received_value": val,
                    "exception_message": str(ex),
                },
            )
        options = spec.options
        # These comparisons may raise (a string against a number): ComfyUI does not catch
        # them here either, so the exception reaches the caller as it does upstream.
        if "min" in options and val < options["min"]:
            return reason(
                "value_smaller_than_min",
                "Value {} smaller than min of {}".format(val, options["min"]),
                f"{x}",
                {"input_name": x, "input_config": info, "received_value": val},
            )
        if "max" in options and val > options["max"]:
            return reason(
                "value_bigger_than_max",
                "Value {} bigger than max of {}".format(val, options["max"]),
                f"{x}",
                {"input_name": x, "input_config": info, "received_value": val},
            )
        if spec.kind is InputKind.LIST:
            combo_options = input_type
            if val not in combo_options:
                input_config: Any = info
                # ComfyUI does not send back long lists, such as many model files.
                if len(combo_options) > 20:
                    list_info = f"(list of length {len(combo_options)})"
                    input_config = None
                else:
                    list_info = str(combo_options)
                return reason(
                    "value_not_in_list",
                    "Value not in list",
                    f"{x}: '{val}' not in {list_info}",
                    {"input_name": x, "input_config": input_config, "received_value": val},
                )
        return None
