"""Reloading consumers.yaml on SIGHUP: what changes live, and what waits for a restart.

Per-model settings, classes, identities, queue limits and reserves change live. Listeners,
upstreams and what the sampler was started with (GPUs, sampling, process matching, external
services) keep their running values until a restart, and the reload says which changed.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import attrs

from gpugate.config.loader import ConfigError, ConfigIssue, load_config_with_warnings
from gpugate.config.model import Config
from gpugate.config.runtime_table import RuntimeTable

if TYPE_CHECKING:
    from gpugate.gate.gate import Gate
    from gpugate.identity import IdentityResolver

log = logging.getLogger("gpugate.serve")

RESTART_CONSUMER_FIELDS = (
    "runtime",
    "listen",
    "upstream",
    "gpu",
    "max_body",
    "processes",
    "timeouts",
    "limits",
)
RESTART_GATE_FIELDS = ("control", "database", "proc_root", "nvml_library", "agent_check")


def unset_secrets(warnings: Sequence[ConfigIssue]) -> str | None:
    """One line naming each `env:` variable the file needs and the environment lacks, and
    each `file:` token the gate cannot read."""
    missing = [w for w in warnings if w.unset_variable]
    files = [w for w in missing if (w.unset_variable or "").startswith("file:")]
    variables = [w for w in missing if w not in files]
    parts = []
    if variables:
        names = ", ".join(f"{w.unset_variable} ({w.file}:{w.line}: {w.path})" for w in variables)
        if len(variables) == 1:
            parts.append(f"environment variable {names} is not set; set it or remove the token")
        else:
            parts.append(
                f"environment variables {names} are not set; set them or remove the tokens"
            )
    if files:
        where = "; ".join(f"{w.message} ({w.file}:{w.line}: {w.path})" for w in files)
        parts.append(f"{where}; make it readable or remove the token")
    return "; ".join(parts) or None


def reload_file(path: Path, reloads: asyncio.Queue[Config], runtimes: RuntimeTable) -> None:
    """SIGHUP: read `path` again (with the `runtimes` it was first read with); queue it if
    valid, else log why and keep the running one."""
    try:
        loaded = load_config_with_warnings(path, runtimes=runtimes)
    except ConfigError as exc:
        log.error("reload: %s is invalid; the running configuration stays in force", path)
        for issue in exc.issues:
            log.error("%s", issue)
        return
    for warning in loaded.warnings:
        log.warning("%s", warning)
    unset = unset_secrets(loaded.warnings)
    if unset:
        log.error("reload: %s; the running configuration stays in force", unset)
        return
    reloads.put_nowait(loaded.config)


def needs_restart(old: Config, new: Config) -> list[str]:
    """Dotted paths of the changed settings that only a restart applies."""
    changed = [
        f"gate.{name}"
        for name in RESTART_GATE_FIELDS
        if getattr(old.gate, name) != getattr(new.gate, name)
    ]
    if old.budget.sample_interval != new.budget.sample_interval:
        changed.append("budget.sample_interval")
    if [g.index for g in old.gpus] != [g.index for g in new.gpus]:
        changed.append("gpus")
    if old.external != new.external:
        changed.append("external")
    before = {c.name: c for c in old.consumers}
    after = {c.name: c for c in new.consumers}
    changed += [f"consumers.{name} (added)" for name in after if name not in before]
    changed += [f"consumers.{name} (removed)" for name in before if name not in after]
    for name, consumer in before.items():
        if name in after:
            changed += [
                f"consumers.{name}.{field}"
                for field in RESTART_CONSUMER_FIELDS
                if getattr(consumer, field) != getattr(after[name], field)
            ]
    return changed


def live_config(old: Config, new: Config) -> Config:
    """`new`, with what only a restart changes kept as it runs in `old`."""
    after = {c.name: c for c in new.consumers}
    consumers = tuple(
        consumer
        if consumer.name not in after
        else attrs.evolve(
            after[consumer.name],
            **{field: getattr(consumer, field) for field in RESTART_CONSUMER_FIELDS},
        )
        for consumer in old.consumers
    )
    same_gpus = [g.index for g in old.gpus] == [g.index for g in new.gpus]
    return attrs.evolve(
        new,
        gate=attrs.evolve(
            old.gate,
            shutdown_grace=new.gate.shutdown_grace,
            control_tokens=new.gate.control_tokens,
            control_public=new.gate.control_public,
        ),
        budget=attrs.evolve(new.budget, sample_interval=old.budget.sample_interval),
        gpus=new.gpus if same_gpus else old.gpus,
        consumers=consumers,
        external=old.external,
    )


def apply_reload(gate: Gate, resolver: IdentityResolver, new: Config) -> None:
    """Apply a reloaded configuration to the running gate and log what waits for a restart."""
    old = gate.config
    restart = needs_restart(old, new)
    live = live_config(old, new)
    gate.reconfigure(live)
    resolver.replace(live.identities)
    log.info("reload: configuration from %s applied", new.source)
    if restart:
        log.warning(
            "reload: changed settings that take effect only after a restart: %s",
            ", ".join(restart),
        )
