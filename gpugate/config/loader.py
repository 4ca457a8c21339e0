"""Read consumers.yaml into the typed Config, reporting every problem with its file and line.

The YAML is composed, not constructed, so every node keeps its position. One walker follows
the attrs model (field types plus the `kind`, `yaml` and `keyed_by` metadata described in
gpugate.config.model) with a small table of scalar readers. Problems are collected rather than
raised one at a time, so an operator sees the whole list in one run of `gpugate check`.

Which runtimes a consumer may name, and the type of each one's section, is the
`RuntimeTable` each load is given: config/ does not know the runtimes, the command that
loads a file does (the shipped table is `gpugate.runtimes.sections.RUNTIME_TABLE`).
"""

from __future__ import annotations

import difflib
import enum
import logging
import os
import re
import typing
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import attrs
import yaml
from yaml.constructor import SafeConstructor
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from gpugate.config.model import (
    ALL_SCOPES,
    Config,
    ControlToken,
    RuntimeSettings,
    Scope,
    TokenEntry,
    default_classes,
)
from gpugate.config.relations import check_relations
from gpugate.config.runtime_table import RuntimeTable
from gpugate.config.scalars import SCALARS, Scalar, describe, is_null, nonblank, runtime_scalar

log = logging.getLogger(__name__)


class Severity(enum.Enum):
    """An error stops the file from loading; a warning does not."""

    ERROR = "error"
    WARNING = "warning"


@attrs.frozen
class ConfigIssue:
    """One problem found in a configuration file: where it is and what is wrong."""

    file: Path
    line: int | None
    """1-based; None when the problem is with the file as a whole (missing, unreadable)."""
    path: str
    """Dotted field path: `consumers.ollama.residency.ttl`, `identities[1].sources[0]`."""
    message: str
    severity: Severity = Severity.ERROR
    unset_variable: str | None = None
    """The environment variable an `env:` token names and the environment lacks."""

    def __str__(self) -> str:
        parts = [f"{self.file}:{self.line}" if self.line else str(self.file)]
        if self.path:
            parts.append(self.path)
        if self.severity is Severity.WARNING:
            parts.append("warning")
        parts.append(self.message)
        return ": ".join(parts)


class ConfigError(ValueError):
    """The file cannot be loaded; `issues` holds every error and warning in file order."""

    def __init__(self, issues: Sequence[ConfigIssue]) -> None:
        self.issues = list(issues)
        super().__init__("\n".join(str(issue) for issue in self.issues))

    @property
    def errors(self) -> list[ConfigIssue]:
        """The issues that stopped the file from loading."""
        return [issue for issue in self.issues if issue.severity is Severity.ERROR]


@attrs.frozen
class LoadedConfig:
    """A configuration that loaded, with the warnings found on the way."""

    config: Config
    warnings: tuple[ConfigIssue, ...]


def load_config(path: Path, *, runtimes: RuntimeTable) -> Config:
    """Load consumers.yaml; warnings go to the log, errors raise ConfigError."""
    loaded = load_config_with_warnings(path, runtimes=runtimes)
    for warning in loaded.warnings:
        log.warning("%s", warning)
    return loaded.config


def load_config_text(
    text: str,
    source: Path,
    environ: Mapping[str, str] | None = None,
    *,
    runtimes: RuntimeTable,
) -> Config:
    """Load configuration text as if read from `source`; errors raise ConfigError."""
    return load_config_text_with_warnings(text, source, environ, runtimes=runtimes).config


def load_config_with_warnings(path: Path, *, runtimes: RuntimeTable) -> LoadedConfig:
    """Load consumers.yaml and return it with its warnings; errors raise ConfigError."""
    try:
        text = path.read_bytes().decode("utf-8-sig")
    except FileNotFoundError:
        raise ConfigError([ConfigIssue(path, None, "", "no such file")]) from None
    except OSError as exc:
        raise ConfigError([ConfigIssue(path, None, "", f"cannot read: {exc.strerror}")]) from None
    except UnicodeDecodeError as exc:
        message = f"not UTF-8 text (byte {exc.start} is {exc.object[exc.start]:#04x})"
        raise ConfigError([ConfigIssue(path, None, "", message)]) from None
    return load_config_text_with_warnings(text, path, runtimes=runtimes)


def load_config_text_with_warnings(
    text: str,
    source: Path,
    environ: Mapping[str, str] | None = None,
    *,
    runtimes: RuntimeTable,
) -> LoadedConfig:
    """Load configuration text as if read from `source`, with its warnings.

    `environ` resolves `env:NAME` tokens (default: the process environment); `runtimes`
    are the runtimes a consumer may name.
    """
    walker = _Walker(source, os.environ if environ is None else environ, runtimes)
    config = walker.load(text)
    issues = sorted(walker.issues, key=lambda issue: issue.line or 0)
    if config is None or any(issue.severity is Severity.ERROR for issue in issues):
        raise ConfigError(issues)
    return LoadedConfig(config, tuple(issues))


def yaml_key(field: attrs.Attribute) -> str:
    """The key a field is written as in the file (`class` for a `priority` field)."""
    return field.metadata.get("yaml", field.name)


_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_ENV_VALUE = Scalar("text or a number", (str, int, float), str)


class _Invalid:
    """Marks a value that could not be read; the reason has already been reported."""


_INVALID = _Invalid()


class _Absent:
    """Marks a list item left out with a warning (a token whose variable is not set)."""


_ABSENT = _Absent()


class UnsetVariable(ValueError):
    """An `env:NAME` token whose variable is not set: the file is right, the environment
    is not (yet). `gpugate check` warns; `gpugate serve` refuses to start."""

    def __init__(self, name: str) -> None:
        super().__init__(f"environment variable {name} is not set")
        self.name = name


class UnreadableTokenFile(UnsetVariable):
    """A `file:PATH` token whose file cannot be read here (absent, or root's only): a
    warning from `gpugate check`, which may run as another user; `gpugate serve` refuses."""

    def __init__(self, path: str, reason: str) -> None:
        ValueError.__init__(self, f"token file {path} cannot be read ({reason})")
        self.name = f"file:{path}"


def _token_file(path: str) -> str:
    if not path:
        raise ValueError("expected a file path after 'file:'")
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise UnreadableTokenFile(path, exc.strerror or str(exc)) from None
    except UnicodeDecodeError:
        raise ValueError(f"token file {path} is not UTF-8 text") from None
    token = text.strip().splitlines()[0].strip() if text.strip() else ""
    if not token:
        raise ValueError(f"token file {path} is empty")
    return token


CREDENTIALS_DIRECTORY = "CREDENTIALS_DIRECTORY"
"""Where systemd puts a unit's credentials (`LoadCredential=ID:PATH`), readable by the
unit's own user, DynamicUser= included."""


class UnreadableCredential(UnreadableTokenFile):
    """A `credential:` token that neither the unit's credentials nor its fallback file give
    here: a warning from `gpugate check`; `gpugate serve` refuses."""

    def __init__(self, where: str, message: str) -> None:
        ValueError.__init__(self, message)
        self.name = f"file:{where}"


def _credential_name(name: str) -> str:
    if not name:
        raise ValueError("expected a credential name after 'credential:'")
    if "/" in name or name in (".", ".."):
        raise ValueError(f"credential name {name!r} is not a file name (no '/')")
    return name


def _token_credential(spec: str, environ: Mapping[str, str]) -> str:
    """`credential:NAME` or `credential:NAME:PATH`: the unit's credential NAME (systemd's
    `LoadCredential=NAME:PATH` puts it in `$CREDENTIALS_DIRECTORY`, readable by the unit's
    user, DynamicUser= included), else, with PATH, that file (a shell or `gpugate check`
    outside the unit, run by a user who may read it)."""
    name, _, fallback = spec.partition(":")
    name, fallback = _credential_name(name.strip()), fallback.strip()
    directory = environ.get(CREDENTIALS_DIRECTORY, "")
    if directory:
        path = Path(directory) / name
        if path.exists():
            return _token_file(str(path))
        missing = f"credential {name} is not in ${CREDENTIALS_DIRECTORY} ({directory})"
    else:
        missing = f"credential {name}: ${CREDENTIALS_DIRECTORY} is not set"
    load = f"LoadCredential={name}:{fallback or 'PATH'}"
    if not fallback:
        where = f"${CREDENTIALS_DIRECTORY}/{name}"
        raise UnreadableCredential(where, f"{missing}; the unit needs {load}")
    try:
        return _token_file(fallback)
    except UnreadableTokenFile as exc:
        message = f"{missing}, and {exc}; the unit needs {load}"
        raise UnreadableCredential(fallback, message) from None


def _scope(text: str) -> Scope:
    nonblank(text)
    try:
        return Scope.parse(text)
    except ValueError as exc:
        close = difflib.get_close_matches(text.strip().lower(), [s.value for s in Scope], n=1)
        if close:
            raise ValueError(f"{exc}; did you mean '{close[0]}'?") from None
        raise


_SCOPE = Scalar(f"a scope ({', '.join(s.value for s in Scope)})", (str,), _scope)


_ORIGIN = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://(?:(?![/?#@])[!-~])+")


def _cors_origin(text: str) -> str:
    """`*` or one origin (`scheme://host[:port]`): the only values of
    Access-Control-Allow-Origin a browser accepts, sent as written."""
    nonblank(text)
    if text == "*" or _ORIGIN.fullmatch(text):
        return text
    raise ValueError(
        f"expected '*' or an origin like 'https://app.example:8443' (no path), got {text!r}"
    )


_CORS_ORIGIN = Scalar("'*' or an origin like 'https://app.example'", (str,), _cors_origin)


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

    def takes(self, reader: _Walker, key: str, key_node: Node, value: Node, path: str) -> bool:
        """Whether `key` of the consumer's mapping is a runtime's setting (taken, or warned
        about when only another runtime reads it)."""
        sub = _join(path, key)
        if self.runtimes.section(key) is not None:
            if key == self.runtime:
                if not is_null(value):
                    reader.lines[sub] = _line(key_node)
                    self.written.append((sub, key_node, value))
            else:
                reader.warn(sub, f"only {_a(key)} consumer reads {_a(key)} section; "
                            f"runtime {self.runtime} ignores it", _line(key_node))  # fmt: skip
            return True
        if key in _keys(self.cls):
            self.written.append((path, key_node, _one(key_node, value)))
            return True
        readers = [e.name for e in self.runtimes.entries if key in _keys(e.section)]
        if readers:
            reader.warn(sub, f"only {_a(' or '.join(readers))} consumer reads {key}; "
                        f"runtime {self.runtime} ignores it", _line(key_node))  # fmt: skip
            return True
        return False

    def hints(self) -> list[str]:
        """The keys of the runtime's section, and the section's own name."""
        known = self.runtimes.section(self.runtime) is not None
        return [*sorted(_keys(self.cls)), *([self.runtime] if known and self.runtime else [])]

    def read(self, reader: _Walker, path: str) -> object:
        """The section's settings: the defaults, then the top-level keys, then the section's."""
        values: dict[str, object] = {}
        where: dict[str, str] = {}
        for sub, _, node in self.written:
            got, ok = reader.fields(self.cls, node, sub, _line(node), {})
            if not ok:
                return _INVALID
            for name, value in got.items():
                if name in where:
                    first = f"{where[name]}.{name}"
                    reader.report(f"{sub}.{name}", f"also given as {first} (line "
                                  f"{reader.line_of(first)}): give it once")  # fmt: skip
                    return _INVALID
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


def _optional(tp: object) -> object:
    """`X | None` -> `X`; anything else unchanged."""
    rest = [arg for arg in typing.get_args(tp) if arg is not type(None)]
    return rest[0] if len(rest) == 1 else tp


def _line(node: Node) -> int:
    return node.start_mark.line + 1


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


class _Walker:
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
            "token": Scalar("a token", (str,), self._token),
            "scope": _SCOPE,
            "cors_origin": _CORS_ORIGIN,
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
        """`node` read as type `tp`, or _INVALID after reporting why not."""
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
        return typing.cast(type, tp)(**values) if ok else _INVALID

    def scalar(self, spec: Scalar, node: Node, path: str, raw: str | None = None):
        """A scalar read with `spec`; `raw` replaces the node's value (keys are read as text)."""
        if not isinstance(node, ScalarNode):
            self.report(path, f"expected {spec.expected}, got {describe(node)}", _line(node))
            return _INVALID
        value: object = raw
        if raw is None:
            try:
                value = self._constructor.construct_object(node)
            except yaml.YAMLError as exc:
                problem = getattr(exc, "problem", None) or exc
                self.report(path, f"cannot read this value: {problem}", _line(node))
                return _INVALID
        wrong_bool = isinstance(value, bool) and bool not in spec.accepts
        if wrong_bool or not isinstance(value, spec.accepts):
            self.report(path, f"expected {spec.expected}, got {describe(node)}", _line(node))
            return _INVALID
        try:
            return spec.convert(value)
        except UnsetVariable as exc:
            self.warn(path, str(exc), _line(node), exc.name)
            return _ABSENT
        except ValueError as exc:
            self.report(path, str(exc), _line(node))
            return _INVALID

    def control_token(self, node: Node, path: str):
        """A `control_tokens` entry: a bare token (every scope) or `{token, scopes}`."""
        if isinstance(node, ScalarNode):
            token = self.scalar(self.scalars["token"], node, path)
            if token is _INVALID or token is _ABSENT:
                return token
            return ControlToken(token, ALL_SCOPES)
        if not isinstance(node, MappingNode):
            self.report(
                path,
                f"expected a token or a mapping with keys token, scopes, got {describe(node)}",
                _line(node),
            )
            return _INVALID
        values, ok = self.fields(TokenEntry, node, path, _line(node), {})
        if not ok:
            return _INVALID
        entry = TokenEntry(**values)
        if entry.token is _ABSENT:
            return _ABSENT  # its variable or file was reported (a warning)
        if not entry.scopes:
            known = ", ".join(s.value for s in Scope)
            self.report(f"{path}.scopes", f"a token needs at least one scope ({known})")
            return _INVALID
        return ControlToken(entry.token, frozenset(entry.scopes))

    def _token(self, text: str) -> str:
        """A bearer token: literal text, `env:NAME` for that environment variable's value,
        `file:PATH` for the file's first line, or `credential:NAME[:PATH]` for the unit's
        credential NAME (`$CREDENTIALS_DIRECTORY/NAME`), else the file PATH."""
        nonblank(text)
        if text.startswith("file:"):
            return _token_file(text.removeprefix("file:").strip())
        if text.startswith("credential:"):
            return _token_credential(text.removeprefix("credential:"), self.environ)
        if not text.startswith("env:"):
            return text
        name = text.removeprefix("env:").strip()
        if not name:
            raise ValueError("expected an environment variable name after 'env:'")
        if name not in self.environ:
            raise UnsetVariable(name)
        if not self.environ[name].strip():
            raise ValueError(f"environment variable {name} is empty")
        return self.environ[name]

    def pairs(self, node: MappingNode, path: str) -> Iterator[tuple[str, Node, Node]]:
        """(key, key node, value node) of each entry; odd and repeated keys are reported."""
        first: dict[str, int] = {}
        for key_node, value_node in node.value:
            if not isinstance(key_node, ScalarNode):
                message = f"a key must be a name, got {describe(key_node)}"
                self.report(path, message, _line(key_node))
                continue
            key, sub, line = key_node.value, _join(path, key_node.value), _line(key_node)
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
            self.report(path, message, _line(node))
            return {}, False
        values, given, ok = dict(fixed), set(), True
        section = RuntimeSection.of(by_key, node, self.runtimes)
        if section is not None:
            del by_key[yaml_key(section.field)]
        for key, key_node, value_node in self.pairs(node, path):
            sub, field = _join(path, key), by_key.get(key)
            if field is None and section and section.takes(self, key, key_node, value_node, path):
                continue
            if field is None:
                self.unknown_key(key, sub, by_key, section.hints() if section else ())
                ok = False
                continue
            given.add(key)
            if is_null(value_node):
                if field.default is attrs.NOTHING:
                    self.report(sub, f"'{key}' needs a value", _line(value_node))
                    ok = False
                continue
            result = self.value(field.type, field.metadata, value_node, sub, _line(key_node))
            if result is _INVALID:
                ok = False
            else:
                values[field.name] = result
        for key, field in by_key.items():
            if field.default is attrs.NOTHING and key not in given:
                self.report(path, f"missing required field '{key}'", line)
                ok = False
        if section is not None:
            settings = section.read(self, path)
            if settings is _INVALID:
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
            self.report(path, message, _line(node))
            return _INVALID
        spec = self.scalars[attrs.fields_dict(attrs.resolve_types(cls))[key_field].type]
        items, first = [], {}
        for key, key_node, value_node in self.pairs(node, path):
            sub, line = _join(path, key), _line(key_node)
            name = self.scalar(spec, key_node, sub, raw=key)
            if name is _INVALID:
                continue
            if name in first:
                label = getattr(name, "label", name)
                self.report(sub, f"'{label}' is given twice (first at line {first[name]})", line)
                continue
            first[name] = line
            if value_field is not None:
                field = attrs.fields_dict(attrs.resolve_types(cls))[value_field]
                if is_null(value_node):
                    self.report(sub, f"'{key}' needs a value", _line(value_node))
                    continue
                value = self.value(field.type, field.metadata, value_node, sub, line)
                if value is not _INVALID:
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
                        _line(node))  # fmt: skip
            return _INVALID
        pairs, ok = [], True
        for key, _, value_node in self.pairs(node, path):
            sub = _join(path, key)
            if not _ENV_NAME.fullmatch(key):
                self.report(sub, f"{key!r} is not a variable name (letters, digits, _)")
                ok = False
                continue
            value = self.scalar(_ENV_VALUE, value_node, sub) if not is_null(value_node) else ""
            if value is _INVALID:
                ok = False
                continue
            pairs.append((key, value))
        return tuple(pairs) if ok else _INVALID

    def sequence(self, item: object, meta: Mapping[str, object], node: Node, path: str):
        """A list, each item read as `item`; invalid as a whole if any item is."""
        if not isinstance(node, SequenceNode):
            self.report(path, f"expected a list, got {describe(node)}", _line(node))
            return _INVALID
        items = []
        for index, item_node in enumerate(node.value):
            sub = f"{path}[{index}]"
            self.lines[sub] = _line(item_node)
            items.append(self.value(item, meta, item_node, sub, _line(item_node)))
        if any(item is _INVALID for item in items):
            return _INVALID
        return tuple(item for item in items if item is not _ABSENT)
