"""Loading configuration text in tests, and reading back what went wrong where."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import attrs
import pytest

from gpugate.config.loader import (
    ConfigError,
    LoadedConfig,
    Severity,
    load_config_text_with_warnings,
)
from gpugate.config.runtime_table import RuntimeTable
from gpugate.runtimes.sections import RUNTIME_TABLE

SOURCE = Path("consumers.yaml")
OLLAMA_DEFAULTS = {
    "runtime": "ollama",
    "listen": "0.0.0.0:11434",
    "upstream": "http://127.0.0.1:11435",
    "processes": "{units: [ollama.service]}",
}


@attrs.frozen
class Found:
    """An issue as the tests compare it: line, field path, message."""

    line: int | None
    path: str
    message: str


def load(
    text: str, environ: Mapping[str, str] | None = None, runtimes: RuntimeTable = RUNTIME_TABLE
) -> LoadedConfig:
    """Load `text` as consumers.yaml with `environ` (empty by default) for env: tokens, and
    `runtimes` (the shipped ones by default)."""
    environ = {} if environ is None else environ
    return load_config_text_with_warnings(text, SOURCE, environ, runtimes=runtimes)


def errors(
    text: str, environ: Mapping[str, str] | None = None, runtimes: RuntimeTable = RUNTIME_TABLE
) -> list[Found]:
    """The errors `text` is rejected with, in the order reported."""
    with pytest.raises(ConfigError) as info:
        load(text, environ, runtimes)
    assert info.value.errors, "a ConfigError must carry at least one error"
    return [Found(i.line, i.path, i.message) for i in info.value.errors]


def warnings(text: str, runtimes: RuntimeTable = RUNTIME_TABLE) -> list[Found]:
    """The warnings of `text`, which must load."""
    loaded = load(text, runtimes=runtimes)
    assert all(w.severity is Severity.WARNING for w in loaded.warnings)
    return [Found(w.line, w.path, w.message) for w in loaded.warnings]


def ollama(**fields: str | None) -> str:
    """A file with one `ollama` consumer, one `key: value` per line.

    Line 1 is `consumers:`, line 2 `ollama:`; then runtime (3), listen (4), upstream (5),
    processes (6), each replaceable in place, and further fields from line 7 in the given
    order. A value of None leaves a default key out.
    """
    values = {**OLLAMA_DEFAULTS, **fields}
    lines = [f"    {key}: {value}\n" for key, value in values.items() if value is not None]
    return "consumers:\n  ollama:\n" + "".join(lines)
