"""The walk of a composed YAML tree against the attrs model, collecting issues by line.

The YAML is composed, not constructed, so every node keeps its position. The walker follows
the attrs model (field types plus the `kind`, `yaml` and `keyed_by` metadata described in
gpugate.config.fields) with a small table of scalar readers (gpugate.config.scalars).
"""

from __future__ import annotations

import difflib
import re
import typing
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import attrs
import yaml
from yaml.constructor import SafeConstructor
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from gpugate.config.fields import yaml_key
from gpugate.config.issues import INVALID, ConfigIssue, Severity, join_path, node_line
from gpugate.config.model import (
    ALL_SCOPES,
    Config,
    ControlToken,
    Scope,
    TokenEntry,
    default_classes,
)
from gpugate.config.relations import check_relations
from gpugate.config.runtime_section import RuntimeSection
from gpugate.config.runtime_table import RuntimeTable
from gpugate.config.scalars import (
    CORS_ORIGIN_SCALAR,
    SCALARS,
    Scalar,
    describe,
    is_null,
    runtime_scalar,
)
from gpugate.config.tokens import SCOPE_SCALAR, UnsetVariable, token_scalar

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_ENV_VALUE = Scalar("text or a number", (str, int, float), str)


class _Absent:
    """Marks a list item left out with a warning (a token whose variable is not set)."""


_ABSENT = _Absent()


def _optional(tp: object) -> object:
    """`X | None` -> `X`; anything else unchanged."""
    rest = [arg for arg in typing.get_args(tp) if arg is not type(None)]
    return rest[0] if len(rest) == 1 else tp


class Walker:
    """Walks a composed YAML tree against the attrs model, collecting issues as it goes.

    Mappings keyed by name keep their valid entries when one entry is broken, so checks
    across entries still run; a list with a broken item is invalid as a whole, because the
    positions (`identities[2]`) that later messages name would no longer match the file.
    """

    def __init__(self, source: Path, environ: Mapping[str, str], runtimes: RuntimeTable) -> None:
        self.source = source
        self.environ = environ
        self.runtimes = runtimes
        self.issues: list[ConfigIssue] = []
        self.lines: dict[str, int] = {}
        """Line of every key and list item seen, by dotted path, for checks across fields."""
        self.scalars = {
            **SCALARS,
            "runtime": runtime_scalar(runtimes),
            "token": token_scalar(environ),
            "scope": SCOPE_SCALAR,
            "cors_origin": CORS_ORIGIN_SCALAR,
        }
        self._constructor = SafeConstructor()

    def report(self, path: str, message: str, line: int | None = None) -> None:
        """Record an error at `path` (at `line`, else where `path` or its parent is written)."""
        line = self._nearest_line(path) if line is None else line
        self.issues.append(ConfigIssue(self.source, line, path, message))

    def warn(
        self, path: str, message: str, line: int | None = None, variable: str | None = None
    ) -> None:
        """Record a warning at `path` (at `line`, else where `path` or its parent is written)."""
        line = self._nearest_line(path) if line is None else line
        issue = ConfigIssue(self.source, line, path, message, Severity.WARNING, variable)
        self.issues.append(issue)

    def has_errors_under(self, path: str) -> bool:
        """Whether an error was already reported at `path` or inside it."""
        return any(issue.path.startswith(path) for issue in self.issues)

    def line_of(self, path: str) -> int | None:
        """The line `path` is written on; None when the file leaves it out."""
        return self.lines.get(path)

    def _nearest_line(self, path: str) -> int | None:
        """Line of `path`, or of its nearest ancestor written in the file."""
        while path and path not in self.lines:
            path = path[: max(path.rfind("."), path.rfind("["), 0)]
        return self.lines.get(path)

    def load(self, text: str) -> Config | None:
        """The Config in `text`, with cross-field checks run; None if it is not YAML at all."""
        try:
            root = yaml.compose(text, Loader=yaml.SafeLoader)
        except yaml.MarkedYAMLError as exc:
            mark = exc.problem_mark or exc.context_mark
            message = f"invalid YAML: {exc.problem or exc.context}"
            if exc.problem and exc.context and exc.context_mark:
                context = f"{exc.context} at line {exc.context_mark.line + 1}"
                message = f"invalid YAML: {context}: {exc.problem}"
            self.report("", message, mark.line + 1 if mark else None)
            return None
        except yaml.YAMLError as exc:
            self.issues.append(ConfigIssue(self.source, None, "", f"invalid YAML: {exc}"))
            return None
        if root is None or is_null(root):
            root = MappingNode("tag:yaml.org,2002:map", [])
        values, _ = self.fields(Config, root, "", 1, {"source": self.source})
        if "classes" in values:
            given = {settings.priority: settings for settings in values["classes"]}
            values["classes"] = tuple(given.get(d.priority, d) for d in default_classes())
        # Sections that failed take their defaults here, so the checks across fields see
        # only what was read correctly and never report a consequence of an earlier error.
        config = Config(**values)
        check_relations(config, self, self.runtimes)
        return config

    def value(self, tp: object, meta: Mapping[str, object], node: Node, path: str, line: int):
        """`node` read as type `tp`, or INVALID after reporting why not."""
        tp = _optional(tp)
        if meta.get("kind") == "string_map":
            return self.string_map(node, path)
        if typing.get_origin(tp) is tuple:
            item = typing.get_args(tp)[0]
            if "keyed_by" in meta:
                value_of = meta.get("value_of")
                value_field = None if value_of is None else str(value_of)
                return self.keyed(item, str(meta["keyed_by"]), node, path, value_field)
            return self.sequence(item, meta, node, path)
        if meta.get("kind") == "control_token":
            return self.control_token(node, path)
        spec = self.scalars.get(meta.get("kind", tp))
        if spec is not None:
            return self.scalar(spec, node, path)
        values, ok = self.fields(typing.cast(type, tp), node, path, line, {})
        return typing.cast(type, tp)(**values) if ok else INVALID

    def scalar(self, spec: Scalar, node: Node, path: str, raw: str | None = None):
        """A scalar read with `spec`; `raw` replaces the node's value (keys are read as text)."""
        if not isinstance(node, ScalarNode):
            self.report(path, f"expected {spec.expected}, got {describe(node)}", node_line(node))
            return INVALID
        value: object = raw
        if raw is None:
            try:
                value = self._constructor.construct_object(node)
            except yaml.YAMLError as exc:
                problem = getattr(exc, "problem", None) or exc
                self.report(path, f"cannot read this value: {problem}", node_line(node))
                return INVALID
        wrong_bool = isinstance(value, bool) and bool not in spec.accepts
        if wrong_bool or not isinstance(value, spec.accepts):
            self.report(path, f"expected {spec.expected}, got {describe(node)}", node_line(node))
            return INVALID
        try:
            return spec.convert(value)
        except UnsetVariable as exc:
            self.warn(path, str(exc), node_line(node), exc.name)
            return _ABSENT
        except ValueError as exc:
            self.report(path, str(exc), node_line(node))
            return INVALID

    def control_token(self, node: Node, path: str):
        """A `control_tokens` entry: a bare token (every scope) or `{token, scopes}`."""
        if isinstance(node, ScalarNode):
            token = self.scalar(self.scalars["token"], node, path)
            if token is INVALID or token is _ABSENT:
                return token
            return ControlToken(token, ALL_SCOPES)
        if not isinstance(node, MappingNode):
            self.report(
                path,
                f"expected a token or a mapping with keys token, scopes, got {describe(node)}",
                node_line(node),
            )
            return INVALID
        values, ok = self.fields(TokenEntry, node, path, node_line(node), {})
        if not ok:
            return INVALID
        entry = TokenEntry(**values)
        if entry.token is _ABSENT:
            return _ABSENT  # its variable or file was reported (a warning)
        if not entry.scopes:
            known = ", ".join(s.value for s in Scope)
            self.report(f"{path}.scopes", f"a token needs at least one scope ({known})")
            return INVALID
        return ControlToken(entry.token, frozenset(entry.scopes))

    def pairs(self, node: MappingNode, path: str) -> Iterator[tuple[str, Node, Node]]:
        """(key, key node, value node) of each entry; odd and repeated keys are reported."""
        first: dict[str, int] = {}
        for key_node, value_node in node.value:
            if not isinstance(key_node, ScalarNode):
                message = f"a key must be a name, got {describe(key_node)}"
                self.report(path, message, node_line(key_node))
                continue
            key, sub, line = key_node.value, join_path(path, key_node.value), node_line(key_node)
            if key in first:
                self.report(sub, f"'{key}' is given twice (first at line {first[key]})", line)
                continue
            first[key] = line
            self.lines[sub] = line
            yield key, key_node, value_node

    def fields(
        self, cls: type, node: Node, path: str, line: int, fixed: dict[str, object]
    ) -> tuple[dict[str, object], bool]:
        """Keyword arguments for `cls` from a mapping, and whether every field was valid.

        `fixed` fields come from outside the mapping (the key of a keyed entry, the source
        file) and may not be written inside it. Absent and null keys take the default.
        """
        by_key = {yaml_key(f): f for f in attrs.fields(attrs.resolve_types(cls))}
        by_key = {key: f for key, f in by_key.items() if f.name not in fixed}
        if is_null(node):
            node = MappingNode("tag:yaml.org,2002:map", [])
        if not isinstance(node, MappingNode):
            message = f"expected a mapping with keys {', '.join(by_key)}, got {describe(node)}"
            self.report(path, message, node_line(node))
            return {}, False
        values, given, ok = dict(fixed), set(), True
        section = RuntimeSection.of(by_key, node, self.runtimes)
        if section is not None:
            del by_key[yaml_key(section.field)]
        for key, key_node, value_node in self.pairs(node, path):
            sub, field = join_path(path, key), by_key.get(key)
            if field is None and section and section.takes(self, key, key_node, value_node, path):
                continue
            if field is None:
                self.unknown_key(key, sub, by_key, section.hints() if section else ())
                ok = False
                continue
            given.add(key)
            if is_null(value_node):
                if field.default is attrs.NOTHING:
                    self.report(sub, f"'{key}' needs a value", node_line(value_node))
                    ok = False
                continue
            result = self.value(field.type, field.metadata, value_node, sub, node_line(key_node))
            if result is INVALID:
                ok = False
            else:
                values[field.name] = result
        for key, field in by_key.items():
            if field.default is attrs.NOTHING and key not in given:
                self.report(path, f"missing required field '{key}'", line)
                ok = False
        if section is not None:
            settings = section.read(self, path)
            if settings is INVALID:
                ok = False
            else:
                values[section.field.name] = settings
        return values, ok

    def unknown_key(
        self, key: str, path: str, by_key: dict[str, attrs.Attribute], also: Sequence[str] = ()
    ) -> None:
        """`also`: more keys the mapping takes (a consumer's runtime section and its settings)."""
        # `priority:` where the file says `class:` is the likeliest slip; difflib misses it.
        renamed = [k for k, f in by_key.items() if f.name == key and k != key]
        keys = [*by_key, *also]
        close = renamed or difflib.get_close_matches(key, keys, n=1)
        if close:
            hint = f"did you mean '{close[0]}'?"
        else:
            hint = f"expected one of {', '.join(keys)}" if keys else "nothing goes here"
        self.report(path, f"unknown key '{key}'; {hint}")

    def keyed(
        self, cls: type, key_field: str, node: Node, path: str, value_field: str | None = None
    ):
        """A mapping of entries keyed by name (or class), each entry read as `cls`; with
        `value_field`, each value is that one field's scalar (`files: {NAME: SIZE}`)."""
        if not isinstance(node, MappingNode):
            message = f"expected a mapping of entries by name, got {describe(node)}"
            self.report(path, message, node_line(node))
            return INVALID
        spec = self.scalars[attrs.fields_dict(attrs.resolve_types(cls))[key_field].type]
        items, first = [], {}
        for key, key_node, value_node in self.pairs(node, path):
            sub, line = join_path(path, key), node_line(key_node)
            name = self.scalar(spec, key_node, sub, raw=key)
            if name is INVALID:
                continue
            if name in first:
                label = getattr(name, "label", name)
                self.report(sub, f"'{label}' is given twice (first at line {first[name]})", line)
                continue
            first[name] = line
            if value_field is not None:
                field = attrs.fields_dict(attrs.resolve_types(cls))[value_field]
                if is_null(value_node):
                    self.report(sub, f"'{key}' needs a value", node_line(value_node))
                    continue
                value = self.value(field.type, field.metadata, value_node, sub, line)
                if value is not INVALID:
                    items.append(cls(**{key_field: name, value_field: value}))
                continue
            values, ok = self.fields(cls, value_node, sub, line, {key_field: name})
            if ok:
                items.append(cls(**values))
        return tuple(items)

    def string_map(self, node: Node, path: str):
        """A mapping of variable names to text (`env:`), as (name, value) pairs in file order."""
        if not isinstance(node, MappingNode):
            self.report(path, f"expected a mapping of names to values, got {describe(node)}",
                        node_line(node))  # fmt: skip
            return INVALID
        pairs, ok = [], True
        for key, _, value_node in self.pairs(node, path):
            sub = join_path(path, key)
            if not _ENV_NAME.fullmatch(key):
                self.report(sub, f"{key!r} is not a variable name (letters, digits, _)")
                ok = False
                continue
            value = self.scalar(_ENV_VALUE, value_node, sub) if not is_null(value_node) else ""
            if value is INVALID:
                ok = False
                continue
            pairs.append((key, value))
        return tuple(pairs) if ok else INVALID

    def sequence(self, item: object, meta: Mapping[str, object], node: Node, path: str):
        """A list, each item read as `item`; invalid as a whole if any item is."""
        if not isinstance(node, SequenceNode):
            self.report(path, f"expected a list, got {describe(node)}", node_line(node))
            return INVALID
        items = []
        for index, item_node in enumerate(node.value):
            sub = f"{path}[{index}]"
            self.lines[sub] = node_line(item_node)
            items.append(self.value(item, meta, item_node, sub, node_line(item_node)))
        if any(item is INVALID for item in items):
            return INVALID
        return tuple(item for item in items if item is not _ABSENT)
