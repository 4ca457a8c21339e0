"""The prompt graph: which node runs next (ExecutionList), each node's cache key (caching.py)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from gpugate_sim.comfyui.nodes import NODES, NodeDef


def is_link(value: Any) -> bool:
    return isinstance(value, list) and len(value) == 2


class ExecutionList:
    """Which node runs next: upstream's ExecutionList and its `ux_friendly_pick_node`."""

    def __init__(
        self,
        prompt: Mapping[str, Any],
        cached: set[str],
        nodes: Mapping[str, NodeDef] = NODES,
    ) -> None:
        self.nodes = nodes
        self.prompt = prompt
        self.cached = cached
        self.pending: dict[str, None] = {}
        self.block_count: dict[str, int] = {}
        self.blocking: dict[str, set[str]] = {}

    def add_node(self, node_id: str) -> None:
        stack, links = [node_id], []
        while stack:
            unique_id = stack.pop()
            if unique_id in self.pending:
                continue
            self.pending[unique_id] = None
            self.block_count[unique_id] = 0
            self.blocking[unique_id] = set()
            for value in self.prompt[unique_id]["inputs"].values():
                if is_link(value):
                    if value[0] not in self.cached:
                        stack.append(value[0])
                    links.append((value[0], unique_id))
        for source, target in links:
            if source not in self.cached:
                self.add_node(source)
                if target not in self.blocking[source]:
                    self.blocking[source].add(target)
                    self.block_count[target] += 1

    def next(self) -> str | None:
        ready = [node_id for node_id in self.pending if self.block_count[node_id] == 0]
        if not ready:
            return None

        def is_output(node_id: str) -> bool:
            return self.nodes[self.prompt[node_id]["class_type"]].output_node

        for node_id in ready:
            if is_output(node_id):
                return node_id
        for node_id in ready:
            if any(is_output(b) for b in self.blocking[node_id]):
                return node_id
        for node_id in ready:
            if any(is_output(c) for b in self.blocking[node_id] for c in self.blocking[b]):
                return node_id
        return ready[0]

    def complete(self, node_id: str) -> None:
        del self.pending[node_id]
        for blocked in self.blocking.pop(node_id, set()):
            self.block_count[blocked] -= 1


def input_signatures(prompt: Mapping[str, Any]) -> dict[str, str]:
    """Each node's cache key: its class and inputs, links replaced by their sources' keys."""
    done: dict[str, str] = {}

    def sign(node_id: str, seen: frozenset[str]) -> str:
        if node_id in done:
            return done[node_id]
        node = prompt[node_id]
        inputs = {}
        for name, value in sorted(node["inputs"].items()):
            if is_link(value) and value[0] in prompt and value[0] not in seen:
                inputs[name] = [sign(value[0], seen | {node_id}), value[1]]
            else:
                inputs[name] = value
        done[node_id] = json.dumps([node["class_type"], inputs], sort_keys=True, default=str)
        return done[node_id]

    for node_id in prompt:
        try:
            sign(node_id, frozenset())
        except (KeyError, TypeError, AttributeError):
            continue
    return done
