"""ComfyUI 0.3.64's own `POST /prompt` validation, decided from its `/object_info` catalog.

Pure: a decoded prompt and a `Catalog` in, a `Verdict` out, never an exception.

The code follows `execution.validate_prompt` / `validate_inputs` step by step, on the prompt
as ComfyUI decoded it, so that the same Python operations (int(), float(), `in`, `<`, indexing
a link's slot) succeed, fail or raise with the same message. It never changes the prompt.

Where ComfyUI iterates a set (the output ids, each node's input names), the order depends on
its process's string hashing; this code takes outputs in prompt order and inputs in
declaration order (required, then optional), one of the orders ComfyUI can take.

It refuses only when ComfyUI certainly refuses. A node whose validation runs code the
catalog cannot describe (`NodeSpec.by_code` classes, an `*` type that may match anything, a
file the gate was not told about) is one the gate cannot judge, but validation goes on
around it: the nodes it links to are validated, and a node linking to a certainly invalid
one is invalid whatever the code says. A cycle is invalid (ComfyUI's recursion runs out
round it). The verdict is UNKNOWN when no output is certainly valid and some output's
validity rests on what only ComfyUI can tell, and when ComfyUI itself would fail with a
500 rather than a 400. A refusal whose body only ComfyUI can write (a traceback, a node
whose own errors come from its code, a cycle) is `exact=False`.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Mapping, Set
from typing import Any

import attrs

from gpugate.runtimes.comfyui.catalog import Catalog
from gpugate.runtimes.comfyui.node_validation import (
    CannotTell,
    Reason,
    Validator,
    full_type_name,
    reason,
)


class Outcome(enum.Enum):
    QUEUE = "queue"
    """ComfyUI validates at least one output and queues the prompt."""
    REFUSE = "refuse"
    """ComfyUI answers 400 with `Verdict.body`."""
    UNKNOWN = "unknown"
    """The catalog cannot decide; forward it as if ComfyUI will queue it."""


@attrs.frozen
class NodeFailure:
    """A node ComfyUI reports in `node_errors`, with the types of its errors."""

    node_id: str
    class_type: str
    errors: tuple[str, ...]


@attrs.frozen
class Verdict:
    outcome: Outcome
    body: bytes = b""
    """REFUSE: the 400 body, as aiohttp's `web.json_response` writes it."""
    error_type: str = ""
    """REFUSE: the top `error.type` (invalid_prompt, prompt_outputs_failed_validation, ...)."""
    failures: tuple[NodeFailure, ...] = ()
    """`node_errors`, also for a QUEUE whose other outputs failed (ComfyUI answers 200)."""
    exact: bool = True
    """False when only ComfyUI can write the body: it holds an exception's traceback, or
    errors of nodes whose validation the gate cannot run (`reason` says which)."""
    refetch: frozenset[str] = frozenset()
    """Classes to fetch anew (`/object_info/{class}`) before the refusal is trusted."""
    reason: str = ""
    """UNKNOWN, or a REFUSE that is not exact: why the gate cannot decide, or cannot word it."""

    @property
    def will_queue(self) -> bool:
        return self.outcome is not Outcome.REFUSE


def _top(kind: str, message: str, details: str) -> Reason:
    return reason(kind, message, details, {})


def _refusal(
    error: Reason,
    node_errors: dict[Any, Any],
    *,
    exact: bool = True,
    refetch: frozenset[str] = frozenset(),
    why: str = "",
) -> Verdict:
    body = json.dumps({"error": error, "node_errors": node_errors}).encode()
    return Verdict(
        Outcome.REFUSE,
        body=body,
        error_type=error["type"],
        failures=_failures(node_errors),
        exact=exact,
        refetch=refetch,
        reason=why,
    )


def _failures(node_errors: Mapping[Any, Any]) -> tuple[NodeFailure, ...]:
    return tuple(
        NodeFailure(
            str(node_id), str(entry["class_type"]), tuple(e["type"] for e in entry["errors"])
        )
        for node_id, entry in node_errors.items()
    )


def _outputs(
    prompt: Mapping[Any, Any], catalog: Catalog, partial_targets: Any
) -> list[Any] | Verdict:
    """The output node ids, or ComfyUI's refusal of a node it cannot run at all."""
    outputs: list[Any] = []
    for x in prompt:
        if "class_type" not in prompt[x]:
            error = _top(
                "invalid_prompt",
                "Cannot execute because a node is missing the class_type property.",
                f"Node ID '#{x}'",
            )
            return _refusal(error, {})
        class_type = prompt[x]["class_type"]
        class_ = catalog.get(class_type)
        if class_ is None:
            error = _top(
                "invalid_prompt",
                f"Cannot execute because node {class_type} does not exist.",
                f"Node ID '#{x}'",
            )
            # A class installed since the catalog was read would make this refusal wrong.
            refetch = frozenset({class_type}) if isinstance(class_type, str) else frozenset()
            return _refusal(error, {}, refetch=refetch)
        # A set upstream; prompt keys are unique, so a list in prompt order is one of its orders.
        if class_.output_node and (partial_targets is None or x in partial_targets):
            outputs.append(x)
    return outputs


def _validate(
    prompt: Mapping[Any, Any],
    catalog: Catalog,
    partial_targets: Any,
    files: Mapping[str, bool] | None,
) -> Verdict:
    outputs = _outputs(prompt, catalog, partial_targets)
    if isinstance(outputs, Verdict):
        return outputs
    if not outputs:
        return _refusal(_top("prompt_no_outputs", "Prompt has no outputs", ""), {})
    validator = Validator(prompt, catalog, files)
    good_outputs: list[Any] = []
    unknown_outputs: list[Any] = []
    failed: list[tuple[Any, list[Reason]]] = []
    node_errors: dict[Any, Any] = {}
    for o in outputs:
        try:
            valid, reasons, _ = validator.inputs(o)
        except Exception as ex:
            validator.tracebacks = True
            valid = False
            reasons = [
                reason(
                    "exception_during_validation",
                    "Exception when validating node",
                    str(ex),
                    {"exception_type": full_type_name(type(ex)), "traceback": []},
                )
            ]
            validator.validated[o] = (False, reasons, o)
        if valid is True:
            good_outputs.append(o)
            continue
        if valid is None:
            # Valid or not, as only ComfyUI can tell: either way it adds no node_errors of
            # nodes the gate judged that the failed outputs do not add too.
            unknown_outputs.append(o)
            continue
        failed.append((o, reasons))
        for node_id, (ok, why, _) in validator.validated.items():
            # Nodes downstream of a failed one are invalid without reasons: not reported.
            if ok is not True and len(why) > 0:
                if node_id not in node_errors:
                    node_errors[node_id] = {
                        "errors": why,
                        "dependent_outputs": [],
                        "class_type": prompt[node_id]["class_type"],
                    }
                node_errors[node_id]["dependent_outputs"].append(o)
    if good_outputs:
        return Verdict(Outcome.QUEUE, failures=_failures(node_errors))
    if unknown_outputs:
        return Verdict(Outcome.UNKNOWN, reason="; ".join(dict.fromkeys(validator.uncertain)))
    details = "\n".join(f"{e['message']}: {e['details']}" for _, errors in failed for e in errors)
    error = _top("prompt_outputs_failed_validation", "Prompt outputs failed validation", details)
    refetch = frozenset(
        str(entry["class_type"])
        for entry in node_errors.values()
        if any(e["type"] == "value_not_in_list" for e in entry["errors"])
    )
    why = "; ".join(dict.fromkeys(validator.uncertain))
    if validator.tracebacks:
        why = "; ".join(filter(None, ("the body holds a traceback", why)))
    exact = not validator.tracebacks and not validator.uncertain
    return _refusal(error, node_errors, exact=exact, refetch=refetch, why=why)


def validate(
    prompt: Any,
    catalog: Catalog,
    partial_targets: Any = None,
    files: Mapping[str, bool] | None = None,
) -> Verdict:
    """What ComfyUI answers to a `POST /prompt` of this `prompt` (and its targets).

    `files`: for each name a file input of the LoadImage family gives, whether ComfyUI has
    that file (`exists_annotated_filepath`); a name not in it is one the gate cannot judge.
    """
    if not isinstance(prompt, dict):
        return Verdict(Outcome.UNKNOWN, reason="the prompt is not an object")
    try:
        return _validate(prompt, catalog, partial_targets, files)
    except CannotTell as why:
        return Verdict(Outcome.UNKNOWN, reason=why.reason)
    except RecursionError:
        return Verdict(Outcome.UNKNOWN, reason="the graph nests too deeply")
    except Exception as ex:
        # Upstream this raises out of post_prompt: aiohttp answers 500, not a refusal.
        return Verdict(Outcome.UNKNOWN, reason=f"ComfyUI fails with {full_type_name(type(ex))}")


def classes_to_refetch(verdict: Verdict, fresh: Set[str] = frozenset()) -> frozenset[str]:
    """Node classes to fetch anew before trusting a refusal; empty when it can be trusted.

    A file added to a model folder since the catalog was read is in ComfyUI's list when it
    validates (it lists folders again then), but not in the catalog: a value_not_in_list
    refusal is trusted only once the classes reporting it come from a catalog read after the
    prompt arrived. `fresh` names the classes already read anew for this prompt.
    """
    if verdict.outcome is not Outcome.REFUSE:
        return frozenset()
    return verdict.refetch - fresh
