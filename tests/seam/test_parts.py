"""Parts are held, not inherited: no class of gpugate inherits more than one of gpugate's
classes, and the gate, the listeners and the control API take a runtime's parts, never the
whole runtime (a `Link` holds the record; what reads it reads one part)."""

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


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, ast.Module]:
    return {module_name(p): ast.parse(p.read_text()) for p in sorted(PACKAGE.rglob("*.py"))}


def gpugate_classes(trees: dict[str, ast.Module]) -> set[str]:
    """Every class gpugate defines, by its module's dotted name."""
    return {
        f"{name}.{node.name}"
        for name, tree in trees.items()
        for node in ast.walk(tree)
        if isinstance(node, ast.ClassDef)
    }


def local_names(name: str, tree: ast.Module) -> dict[str, str]:
    """What each name a module may use as a base stands for: its own classes and what it
    imports, as dotted names."""
    names = {
        node.name: f"{name}.{node.name}" for node in tree.body if isinstance(node, ast.ClassDef)
    }
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                names[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    return names


def gpugate_bases(trees: dict[str, ast.Module]) -> dict[str, list[str]]:
    """Each gpugate class → the gpugate classes among its bases (re-exports followed)."""
    classes = gpugate_classes(trees)
    found: dict[str, list[str]] = {}
    for name, tree in trees.items():
        names = local_names(name, tree)
        for node in ast.walk(tree):
            if not isinstance(node, ast.ClassDef):
                continue
            bases = []
            for base in node.bases:
                if isinstance(base, ast.Name) and base.id in names:
                    bases.append(resolve(names[base.id], trees, classes))
            found[f"{name}.{node.name}"] = [b for b in bases if b in classes]
    return found


def resolve(dotted: str, trees: dict[str, ast.Module], classes: set[str]) -> str:
    """A dotted name as its defining module spells it (a face like runtimes/base.py
    re-exports the parts)."""
    seen = set()
    while dotted not in classes and dotted not in seen:
        seen.add(dotted)
        module, _, name = dotted.rpartition(".")
        tree = trees.get(module)
        if tree is None:
            break
        dotted = local_names(module, tree).get(name, dotted)
    return dotted


def test_no_class_inherits_more_than_one_gpugate_class():
    trees = modules()
    stacked = {cls: bases for cls, bases in gpugate_bases(trees).items() if len(bases) > 1}
    assert stacked == {}


def test_the_check_sees_a_stack_of_mixins():
    trees = {
        "gpugate.a": ast.parse("class One: ...\nclass Two: ...\n"),
        "gpugate.b": ast.parse("from gpugate.a import One, Two\nclass Both(One, Two): ...\n"),
    }
    assert gpugate_bases(trees)["gpugate.b.Both"] == ["gpugate.a.One", "gpugate.a.Two"]


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


SIZING = ("gate/envelopes.py",)
"""The gate's sizing: it takes a runtime's memory part, and nothing else of a runtime."""


def runtime_reads(tree: ast.Module) -> list[str]:
    """Every runtime part (or link) a module reads, as `part` names."""
    read = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in PARTS | {"runtime"}:
            read.append(node.attr)
        if isinstance(node, ast.Name) and node.id in {"Link", "Runtime", "ModelSettings"}:
            read.append(node.id)
    return read


def test_the_sizing_takes_only_the_memory_part():
    for name in SIZING:
        tree = ast.parse((PACKAGE / name).read_text())
        assert runtime_reads(tree) == [], name
        parameters = {
            arg.annotation.id
            for node in ast.walk(tree)
            if isinstance(node, ast.FunctionDef)
            for arg in node.args.args
            if isinstance(arg.annotation, ast.Name)
        }
        assert "Memory" in parameters, name


def test_the_sizing_check_sees_another_part():
    code = "def size(link: Link) -> int:\n    return link.runtime.settings.envelope\n"
    assert sorted(runtime_reads(ast.parse(code))) == ["Link", "runtime", "settings"]
