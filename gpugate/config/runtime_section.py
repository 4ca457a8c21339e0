"""A consumer's runtime section (`comfyui:`), read as the type its runtime's table entry gives."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

import attrs
from yaml.nodes import MappingNode, Node, ScalarNode

from gpugate.config.consumer import RuntimeSettings
from gpugate.config.fields import yaml_key
from gpugate.config.issues import INVALID, join_path, node_line
from gpugate.config.runtime_table import RuntimeTable
from gpugate.config.scalars import is_null


class SectionReader(Protocol):
    """What a runtime section needs of the walker reading its consumer
    (gpugate.config.walker.Walker)."""

    lines: dict[str, int]

    def report(self, path: str, message: str, line: int | None = None) -> None: ...

    def warn(
        self, path: str, message: str, line: int | None = None, variable: str | None = None
    ) -> None: ...

    def line_of(self, path: str) -> int | None: ...

    def fields(
        self, cls: type, node: Node, path: str, line: int, fixed: dict[str, object]
    ) -> tuple[dict[str, object], bool]: ...


@attrs.define
class RuntimeSection:
    """A consumer's runtime section (`comfyui:` for `runtime: comfyui`), read as the type
    the runtime table gives its runtime. Its keys may also stand at the consumer's top level,
    as they did before sections; a key only another runtime reads is a warning."""

    field: attrs.Attribute
    runtime: str | None
    """The runtime's name as the mapping writes it (checked where `runtime:` is read)."""
    cls: type
    runtimes: RuntimeTable
    written: list[tuple[str, Node, Node]] = attrs.Factory(list)
    """(path, key, value) of each setting given: at the top level, then in the section."""

    @classmethod
    def of(
        cls, by_key: Mapping[str, attrs.Attribute], node: MappingNode, runtimes: RuntimeTable
    ) -> RuntimeSection | None:
        found = next((f for f in by_key.values() if "section_of" in f.metadata), None)
        if found is None:
            return None
        named = str(found.metadata["section_of"])
        runtime = None
        for key_node, value_node in node.value:
            if getattr(key_node, "value", None) == named and isinstance(value_node, ScalarNode):
                runtime = str(value_node.value).strip().lower()
        settings = runtimes.section(runtime) or RuntimeSettings
        return cls(found, runtime, settings, runtimes)

    def takes(
        self, reader: SectionReader, key: str, key_node: Node, value: Node, path: str
    ) -> bool:
        """Whether `key` of the consumer's mapping is a runtime's setting (taken, or warned
        about when only another runtime reads it)."""
        sub = join_path(path, key)
        if self.runtimes.section(key) is not None:
            if key == self.runtime:
                if not is_null(value):
                    reader.lines[sub] = node_line(key_node)
                    self.written.append((sub, key_node, value))
            else:
                reader.warn(sub, f"only {_a(key)} consumer reads {_a(key)} section; "
                            f"runtime {self.runtime} ignores it", node_line(key_node))  # fmt: skip
            return True
        if key in _keys(self.cls):
            self.written.append((path, key_node, _one(key_node, value)))
            return True
        readers = [e.name for e in self.runtimes.entries if key in _keys(e.section)]
        if readers:
            reader.warn(sub, f"only {_a(' or '.join(readers))} consumer reads {key}; "
                        f"runtime {self.runtime} ignores it", node_line(key_node))  # fmt: skip
            return True
        return False

    def hints(self) -> list[str]:
        """The keys of the runtime's section, and the section's own name."""
        known = self.runtimes.section(self.runtime) is not None
        return [*sorted(_keys(self.cls)), *([self.runtime] if known and self.runtime else [])]

    def read(self, reader: SectionReader, path: str) -> object:
        """The section's settings: the defaults, then the top-level keys, then the section's."""
        values: dict[str, object] = {}
        where: dict[str, str] = {}
        for sub, _, node in self.written:
            got, ok = reader.fields(self.cls, node, sub, node_line(node), {})
            if not ok:
                return INVALID
            for name, value in got.items():
                if name in where:
                    first = f"{where[name]}.{name}"
                    reader.report(f"{sub}.{name}", f"also given as {first} (line "
                                  f"{reader.line_of(first)}): give it once")  # fmt: skip
                    return INVALID
                values[name], where[name] = value, sub
        return self.cls(**values)


def _a(noun: str) -> str:
    return f"an {noun}" if noun[:1] in "aeiou" else f"a {noun}"


def _keys(cls: type) -> set[str]:
    return (
        {yaml_key(f) for f in attrs.fields(attrs.resolve_types(cls))} if attrs.has(cls) else set()
    )


def _one(key_node: Node, value: Node) -> MappingNode:
    """A top-level setting as a mapping of its own, read like the section's."""
    return MappingNode(
        "tag:yaml.org,2002:map", [(key_node, value)], key_node.start_mark, value.end_mark
    )
