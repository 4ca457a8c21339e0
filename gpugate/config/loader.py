"""Read consumers.yaml into the typed Config, reporting every problem with its file and line.

The YAML is composed, not constructed, so every node keeps its position; the walk against the
attrs model is gpugate.config.walker, what it finds gpugate.config.issues (re-exported here).
Problems are collected rather than raised one at a time, so an operator sees the whole list
in one run of `gpugate check`.

Which runtimes a consumer may name, and the type of each one's section, is the
`RuntimeTable` each load is given: config/ does not know the runtimes, the command that
loads a file does (the shipped table is `gpugate.runtimes.sections.RUNTIME_TABLE`).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from pathlib import Path

from gpugate.config.issues import ConfigError, ConfigIssue, LoadedConfig, Severity
from gpugate.config.model import Config
from gpugate.config.runtime_table import RuntimeTable
from gpugate.config.walker import Walker

__all__ = [
    "ConfigError",
    "ConfigIssue",
    "LoadedConfig",
    "Severity",
    "load_config",
    "load_config_text",
    "load_config_text_with_warnings",
    "load_config_with_warnings",
]

log = logging.getLogger(__name__)


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
    walker = Walker(source, os.environ if environ is None else environ, runtimes)
    config = walker.load(text)
    issues = sorted(walker.issues, key=lambda issue: issue.line or 0)
    if config is None or any(issue.severity is Severity.ERROR for issue in issues):
        raise ConfigError(issues)
    return LoadedConfig(config, tuple(issues))
