"""What loading consumers.yaml finds: each issue at its file, line and dotted field path."""

from __future__ import annotations

import enum
from collections.abc import Sequence
from pathlib import Path

import attrs
from yaml.nodes import Node

from gpugate.config.model import Config


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


class _Invalid:
    """Marks a value that could not be read; the reason has already been reported."""


INVALID = _Invalid()


def node_line(node: Node) -> int:
    """The 1-based line `node` starts on."""
    return node.start_mark.line + 1


def join_path(path: str, key: str) -> str:
    """The dotted field path of `key` inside `path` (`key` alone at the top)."""
    return f"{path}.{key}" if path else key
