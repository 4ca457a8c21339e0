"""The gate, the listeners and the control API take a runtime's parts, never the whole
runtime (a `Link` holds the record; what reads it reads one part)."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "gpugate"
USERS = ("gate", "proxy", "control")
"""The parts of the gpugate that use runtimes: each takes the runtime's part it uses."""
PARTS = frozenset(
    {
        "settings",
        "reading",
        "vetting",
        "residents",
        "inventory",
        "jobs",
        "memory",
        "lifecycle",
        "placement",
        "health",
    }
)


def whole_runtimes(tree: ast.Module) -> list[str]:
    """Where a module takes a whole runtime: a parameter annotated `Runtime`, or a
    `.runtime` read that is not followed by one of its parts."""
    found = []
    parents: dict[ast.AST, ast.AST] = {}
    for node in ast.walk(tree):
        for child in ast.iter_child_nodes(node):
            parents[child] = node
    for node in ast.walk(tree):
        if isinstance(node, ast.arg) and node.annotation is not None:
            named = {n.id for n in ast.walk(node.annotation) if isinstance(n, ast.Name)}
            if "Runtime" in named:
                found.append(f"line {node.lineno}: parameter {node.arg} is a Runtime")
        if (
            isinstance(node, ast.Attribute)
            and node.attr == "runtime"
            and isinstance(node.ctx, ast.Load)
        ):
            parent = parents.get(node)
            if not (isinstance(parent, ast.Attribute) and parent.attr in PARTS):
                found.append(f"line {node.lineno}: the whole runtime is read")
    return found


def test_the_gate_the_listeners_and_the_control_api_take_parts():
    found = {}
    for user in USERS:
        for path in sorted((PACKAGE / user).rglob("*.py")):
            taken = whole_runtimes(ast.parse(path.read_text()))
            if taken:
                found[str(path.relative_to(PACKAGE))] = taken
    assert found == {}


def test_the_check_sees_a_whole_runtime_taken():
    code = (
        "def f(runtime: Runtime) -> None: ...\n"
        "def g(link) -> None:\n"
        "    h(link.runtime)\n"
        "    link.runtime.reading.classify()\n"
        "    link.runtime = other\n"
    )
    assert whole_runtimes(ast.parse(code)) == [
        "line 1: parameter runtime is a Runtime",
        "line 3: the whole runtime is read",
    ]
