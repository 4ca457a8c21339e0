"""`GET /object_info`: the node classes as ComfyUI 0.3.64's server.py describes them.

A nodes.py class goes through server.py `node_info`, which writes `output_tooltips` and
`deprecated` only when the class has them; a comfy_extras class goes through
`GET_NODE_INFO_V1` (comfy_api/latest/_io.py), which writes every field of `NodeInfoV1`,
nulls and false flags included. Both key orders are kept, so the JSON text matches too.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpugate.sim.comfyui.nodes import NODES, Api, NodeDef

Files = Mapping[str, list[str]]


def object_info(files: Files, nodes: Mapping[str, NodeDef] = NODES) -> dict[str, Any]:
    """Every class, in registration order."""
    return {name: node_info(node, files) for name, node in nodes.items()}


def object_info_node(
    name: str, files: Files, nodes: Mapping[str, NodeDef] = NODES
) -> dict[str, Any]:
    """`/object_info/{node_class}`: the one class, or `{}` for a class ComfyUI does not have."""
    node = nodes.get(name)
    return {} if node is None else {name: node_info(node, files)}


def node_info(node: NodeDef, files: Files) -> dict[str, Any]:
    return _v3(node, files) if node.api is Api.V3 else _v1(node, files)


def _inputs(node: NodeDef, files: Files) -> dict[str, dict[str, Any]]:
    declared: dict[str, dict[str, Any]] = {
        "required": {i.name: i.config(files) for i in node.inputs if i.required}
    }
    optional = {i.name: i.config(files) for i in node.inputs if not i.required}
    if optional:
        declared["optional"] = optional
    if node.hidden:
        # INPUT_TYPES writes a hidden input as a bare string; a Schema as a 1-tuple.
        v3 = node.api is Api.V3
        declared["hidden"] = {name: [value] if v3 else value for name, value in node.hidden}
    return declared


def _v1(node: NodeDef, files: Files) -> dict[str, Any]:
    """server.py `node_info` for a class without `_ComfyNodeInternal`."""
    declared = _inputs(node, files)
    info: dict[str, Any] = {
        "input": declared,
        "input_order": {key: list(value) for key, value in declared.items()},
        "output": list(node.outputs),
        "output_is_list": [False] * len(node.outputs),
        "output_name": list(node.outputs),
        "name": node.class_type,
        "display_name": node.display_name or node.class_type,
        "description": node.description,
        "python_module": node.python_module,
        "category": node.category,
        "output_node": node.output_node,
    }
    if node.output_tooltips is not None:
        info["output_tooltips"] = list(node.output_tooltips)
    if node.deprecated:
        info["deprecated"] = True
    if node.experimental:
        info["experimental"] = True
    return info


def _v3(node: NodeDef, files: Files) -> dict[str, Any]:
    """`Schema.get_v1_info` as `asdict(NodeInfoV1)`: every field, in the dataclass's order."""
    declared = _inputs(node, files)
    tooltips = node.output_tooltips or (None,) * len(node.outputs)
    return {
        "input": declared,
        "input_order": {key: list(value) for key, value in declared.items()},
        "output": list(node.outputs),
        "output_is_list": [False] * len(node.outputs),
        "output_name": list(node.outputs),
        "output_tooltips": list(tooltips),
        "name": node.class_type,
        "display_name": node.display_name,
        "description": node.description,
        "python_module": node.python_module,
        "category": node.category,
        "output_node": node.output_node,
        "deprecated": node.deprecated,
        "experimental": False,
        "api_node": False,
    }
