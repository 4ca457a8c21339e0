"""`gpugate check [FILE]`: validate a consumers.yaml and say what it configures.

The command hands in the runtimes a consumer may name (`RuntimeTable`): this module, as
all of config/, does not know them."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TextIO

from gpugate.config.loader import ConfigError, LoadedConfig, load_config_with_warnings
from gpugate.config.runtime_table import RuntimeTable
from gpugate.core.units import format_gib

EXIT_OK = 0
EXIT_INVALID = 78
"""EX_CONFIG: the file does not load, as every command exits for a configuration it cannot
use (gpugate.commands.exits.Exit.CONFIG)."""


def run_check(
    path: Path,
    out: TextIO | None = None,
    err: TextIO | None = None,
    *,
    runtimes: RuntimeTable,
) -> int:
    """Check `path` against `runtimes`: summary on `out` and 0 if it loads, every issue on
    `err` and 78 if not."""
    out = sys.stdout if out is None else out
    err = sys.stderr if err is None else err
    try:
        loaded = load_config_with_warnings(path, runtimes=runtimes)
    except ConfigError as exc:
        for issue in exc.issues:
            print(issue, file=err)
        return EXIT_INVALID
    for warning in loaded.warnings:
        print(warning, file=err)
    print(f"{path}: ok — {summary(loaded)}", file=out)
    return EXIT_OK


def summary(loaded: LoadedConfig) -> str:
    """One line on what a loaded file configures, for `gpugate check` and the gate's log."""
    config = loaded.config
    names = ", ".join(consumer.name for consumer in config.consumers)
    consumers = _count(len(config.consumers), "consumer", "consumers")
    parts = [f"{consumers} ({names})" if names else consumers]
    parts.append(_count(len(config.external), "external service", "external services"))
    parts.append(_count(len(config.identities), "identity", "identities"))
    parts.append(f"reserve {format_gib(config.budget.reserve)}")
    if loaded.warnings:
        parts.append(_count(len(loaded.warnings), "warning", "warnings"))
    return ", ".join(parts)


def _count(number: int, singular: str, plural: str) -> str:
    return f"{number} {singular if number == 1 else plural}"
