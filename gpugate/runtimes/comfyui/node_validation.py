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


def _is_link(value: Any) -> bool:
    """comfy_execution/graph_utils.py `is_link`."""
    return (
        isinstance(value, list)
        and len(value) == 2
        and isinstance(value[0], str)
        and isinstance(value[1], (int, float))
    )


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


Validity = bool | None
"""A node's validity: True, False, or None when only ComfyUI can tell."""
NodeResult = tuple[Validity, list[Reason], Any]
"""`validate_inputs`'s `(valid, errors, unique_id)`, valid None when the gate cannot tell."""


class Validator:
    """`validate_inputs` with its `validated` memo, over one prompt and catalog.

    `files` says which names `folder_paths.exists_annotated_filepath` finds (the file
    checks of the LoadImage family); a name it lacks is one the gate cannot judge.
    """

    def __init__(
        self,
        prompt: Mapping[Any, Any],
        catalog: Catalog,
        files: Mapping[str, bool] | None = None,
    ) -> None:
        self.prompt = prompt
        self.catalog = catalog
        self.files: Mapping[str, bool] = files or {}
        self.validated: dict[Any, NodeResult] = {}
        self.active: list[Any] = []
        self.tracebacks = False
        self.uncertain: list[str] = []
        """Why the body of a refusal may not be ComfyUI's: nodes whose own errors only
        ComfyUI can write (code the catalog cannot describe, a cycle)."""

    def spec(self, class_type: Any) -> NodeSpec:
        spec = self.catalog.get(class_type)
        # validate_prompt has checked every node's class_type exists.
        assert spec is not None
        return spec

    def inputs(self, unique_id: Any) -> NodeResult:
        if unique_id in self.validated:
            return self.validated[unique_id]
        if unique_id in self.active:
            # ComfyUI recurses round the cycle until Python's recursion limit; the
            # RecursionError is caught as an exception of an inner node, so every node on
            # the cycle, and every node linking to it, is invalid. What the caught
            # exception leaves in node_errors depends on where the stack ran out.
            self.uncertain.append("the graph has a cycle")
            return (False, [], unique_id)
        if len(self.active) >= MAX_DEPTH:
            # Whether ComfyUI's own recursion runs out here depends on its stack.
            self.uncertain.append(f"a chain of links deeper than {MAX_DEPTH}")
            return (None, [], unique_id)
        self.active.append(unique_id)
        try:
            ret = self._inputs(unique_id)
        except CannotTell as why:
            self.uncertain.append(why.reason)
            ret = (None, [], unique_id)
        finally:
            self.active.pop()
        self.validated[unique_id] = ret
        return ret

    def _inputs(self, unique_id: Any) -> NodeResult:
        inputs = self.prompt[unique_id]["inputs"]
        class_type = self.prompt[unique_id]["class_type"]
        node = self.spec(class_type)
        if node.by_code:
            return self._by_code(unique_id, node, inputs)
        errors: list[Reason] = []
        valid: Validity = True
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
            if isinstance(val, list):
                outcome = self._link(spec, val, errors)
                if outcome is False:
                    valid = False
                elif outcome is None and valid is True:
                    valid = None
                continue
            if node.file_check is not None and x == node.file_check.input:
                # An argument of VALIDATE_INPUTS: converted, but not checked against min,
                # max or the value list; the function judges it below.
                continue
            error = self._literal(spec, val)
            if error is not None:
                errors.append(error)
        if node.file_check is not None:
            error = self._file(node, inputs)
            if error is not None:
                errors.append(error)
        if errors or valid is False:
            return (False, errors, unique_id)
        return (None, [], unique_id) if valid is None else (True, [], unique_id)

    def _by_code(self, unique_id: Any, node: NodeSpec, inputs: Mapping[str, Any]) -> NodeResult:
        """A node whose validation runs code the catalog cannot describe: its own errors
        are ComfyUI's to find, but an invalid node it links to makes it invalid (ComfyUI
        follows the link, or refuses its type)."""
        self.uncertain.append(f"{node.name} validates by code")
        valid: Validity = None
        for spec in node.validated_inputs:
            val = inputs.get(spec.name)
            if not isinstance(val, list) or len(val) != 2:
                continue
            # Read as ComfyUI reads a link before its type check: these may raise.
            linked = self.spec(self.prompt[val[0]]["class_type"])
            if not linked.outputs and linked.by_code:
                continue  # its RETURN_TYPES are not in the catalog
            linked.outputs[val[1]]
            if self._follow(spec, val) is False:
                valid = False
        return (valid, [], unique_id)

    def _file(self, node: NodeSpec, inputs: Mapping[str, Any]) -> Reason | None:
        """The LoadImage family's VALIDATE_INPUTS: `exists_annotated_filepath(name)`
        (nodes.py `LoadImage.VALIDATE_INPUTS`, folder_paths.py). It runs after the other
        checks whatever they found; what makes it raise raises here too."""
        check = node.file_check
        assert check is not None
        x = check.input
        if x not in inputs:
            # execution.get_input_data passes only the inputs the prompt gives.
            raise TypeError(f"{check.function}() missing 1 required positional argument: '{x}'")
        val = inputs[x]
        if isinstance(val, dict) and "__value__" in val:
            val = val["__value__"]
        if _is_link(val):
            # get_input_data passes None for a link while validating (no outputs yet).
            val = None
        if not isinstance(val, str):
            # folder_paths.annotated_filepath's `name.endswith`.
            raise AttributeError(f"'{type(val).__name__}' object has no attribute 'endswith'")
        exists = self.files.get(val)
        if exists is None:
            raise CannotTell(f"whether ComfyUI has the file {val!r}")
        if exists:
            return None
        return reason(
            "custom_validation_failed",
            "Custom validation failed for node",
            f"{x} - {check.message.format(val)}",
            {"input_name": x},
        )

    def _link(self, spec: InputSpec, val: list[Any], errors: list[Reason]) -> Validity:
        """A `[node_id, slot]` input: False when the linked node is invalid, None when
        only ComfyUI can tell whether the link is (or the node behind it)."""
        x = spec.name
        if len(val) != 2:
            errors.append(
                reason(
                    "bad_linked_input",
                    "Bad linked input, must be a length-2 list of [node_id, slot_index]",
                    f"{x}",
                    {"input_name": x, "input_config": spec.config, "received_value": val},
                )
            )
            return True
        o_id = val[0]
        o_class_type = self.prompt[o_id]["class_type"]
        # RETURN_TYPES is a tuple in ComfyUI's own v1 classes: same IndexError text.
        linked = self.spec(o_class_type)
        r = linked.outputs
        received_type = _thaw(r[val[1]])
        input_type = spec.input_type
        if linked.by_code or (
            not types_match(received_type, input_type) and "*" in (received_type, input_type)
        ):
            # Its output type may be a str whose `__ne__` matches more than its text (a
            # pack's types, ComfyUI's `*`): the link either matches and ComfyUI follows it,
            # or ComfyUI refuses its type. Invalid behind it is invalid either way.
            self.uncertain.append(f"{x} links {received_type} to {input_type}")
            return False if self._follow(spec, val) is False else None
        if not types_match(received_type, input_type):
            details = f"{x}, received_type({received_type}) mismatch input_type({input_type})"
            errors.append(
                reason(
                    "return_type_mismatch",
                    "Return type mismatch between linked nodes",
                    details,
                    {
                        "input_name": x,
                        "input_config": spec.config,
                        "received_type": received_type,
                        "linked_node": val,
                    },
                )
            )
            return True
        return self._follow(spec, val)

    def _follow(self, spec: InputSpec, val: list[Any]) -> Validity:
        """Validate the node a link names, as ComfyUI recurses into it: an exception there
        is that node's reason (exception_during_inner_validation)."""
        x = spec.name
        o_id = val[0]
        try:
            outcome = self.inputs(o_id)[0]
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
                            "input_config": spec.config,
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
        return True if outcome is True else outcome

    def _literal(self, spec: InputSpec, val: Any) -> Reason | None:
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
                    "input_config": spec.config,
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
                {"input_name": x, "input_config": spec.config, "received_value": val},
            )
        if "max" in options and val > options["max"]:
            return reason(
                "value_bigger_than_max",
                "Value {} bigger than max of {}".format(val, options["max"]),
                f"{x}",
                {"input_name": x, "input_config": spec.config, "received_value": val},
            )
        if spec.kind is InputKind.LIST:
            combo_options = input_type
            if val not in combo_options:
                input_config: Any = spec.config
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
