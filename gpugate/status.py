"""`gpugate status`: the VRAM budget per GPU, as a person reads it or as JSON.

With a gate running, the numbers are the gate's own (leases, residents, queue). Without
one, NVML is sampled directly and the budget holds only what NVML shows.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any, TextIO

import aiohttp

from gpugate.config.model import Config
from gpugate.config.paths import default_config_path
from gpugate.core.budget import GpuBudget, compute_budget
from gpugate.core.units import GiB

SCHEMA = 1


def budget_document(budget: GpuBudget, age: float | None) -> dict[str, Any]:
    """One GPU's budget in bytes, for JSON."""
    return {
        "index": budget.gpu,
        "uuid": budget.uuid,
        "name": budget.name,
        "sample_age_seconds": None if age is None else round(age, 3),
        "total": budget.total,
        "driver_reserved": budget.reserved,
        "used": budget.used,
        "free": budget.free,
        "external": {row.name: row.bytes for row in budget.external},
        "external_total": budget.external_total,
        "reclaiming": budget.reclaiming,
        "consumers": {
            row.name: {
                "observed": row.observed,
                "resident": row.resident,
                "pending": row.pending,
                "unexplained": row.unexplained,
                "committed": row.committed,
            }
            for row in sorted(budget.consumers, key=lambda r: (-r.committed, r.name))
        },
        "committed_total": budget.committed_total,
        "reserve": budget.reserve,
        "schedulable": budget.schedulable,
    }


def _gib(nbytes: int) -> str:
    return f"{nbytes / GiB:5.1f} GiB"


def render_text(document: dict[str, Any]) -> str:
    """The budget table, one block per GPU."""
    lines = []
    if document.get("source") == "nvml":
        lines.append(document.get("note", "no gate running: sampled NVML directly"))
    for gpu in document["gpus"]:
        age = gpu.get("sample_age_seconds")
        age_text = "" if age is None else f"  sample {age:.1f}s old"
        lines.append(f"GPU {gpu['index']}  {gpu['name']}  {gpu['uuid']}{age_text}")
        lines.append(f"  {'total':<26}{_gib(gpu['total'])}")
        lines.append(f"  {'driver reserved':<26}{_gib(gpu['driver_reserved'])}")
        lines.append(f"  {'external':<26}{_gib(gpu['external_total'])}")
        for name, nbytes in gpu["external"].items():
            lines.append(f"    {name:<24}{_gib(nbytes)}")
        lines.append(f"  {'managed (committed)':<26}{_gib(gpu['committed_total'])}")
        for name, row in gpu["consumers"].items():
            detail = ""
            if row["resident"] or row["pending"]:
                detail = (
                    f"   observed {row['observed'] / GiB:.1f}, resident "
                    f"{row['resident'] / GiB:.1f}, leased {row['pending'] / GiB:.1f}"
                )
            lines.append(f"    {name:<24}{_gib(row['committed'])}{detail}")
        lines.append(f"  {'reserve':<26}{_gib(gpu['reserve'])}")
        lines.append(f"  {'schedulable':<26}{_gib(gpu['schedulable'])}")
    for section, title in (("leases", "leases"), ("queue", "waiting")):
        rows = document.get(section) or []
        if rows:
            lines.append(
                f"{title}: "
                + ", ".join(f"{r['consumer']}/{r['model']} ({r['class']})" for r in rows)
            )
    return "\n".join(lines)


def direct_document(config: Config) -> dict[str, Any]:
    """Sample NVML in this process (no gate is running)."""
    from gpugate.gpu.sampler import Sampler

    sampler = Sampler.from_config(config)
    try:
        sample = sampler.sample_blocking()
    finally:
        sampler.close()
    if sample.error is not None:
        raise RuntimeError(
            f"DRIVER_ERROR: NVML {sample.error.name} ({sample.error.code}) in "
            f"{sample.error.call or 'init'}: {sample.error.message}"
        )
    gpus = []
    for device in sample.devices:
        budget = compute_budget(
            device,
            sampled_at=sample.taken_at,
            reserve=config.reserve_for(device.index),
            consumers=[c.name for c in config.consumers if c.gpu == device.index],
        )
        gpus.append(budget_document(budget, 0.0))
    return {
        "schema": SCHEMA,
        "source": "nvml",
        "note": "no gate running: sampled NVML directly (no leases or residents known)",
        "time": time.time(),
        "driver_version": sample.driver_version,
        "gpus": gpus,
    }


async def _from_gate(url: str) -> dict[str, Any] | None:
    timeout = aiohttp.ClientTimeout(total=2.0, sock_connect=0.5)
    try:
        async with (
            aiohttp.ClientSession(timeout=timeout) as session,
            session.get(url) as resp,
        ):
            if resp.status != 200:
                return None
            document: dict[str, Any] = await resp.json()
            return document
    except (aiohttp.ClientError, TimeoutError, ValueError):
        return None


def run_status(config_path: Path | None, *, as_json: bool, out: TextIO | None = None) -> int:
    """Print the budget; 0 on success, 2 on a bad config, 1 when NVML cannot be read."""
    import asyncio

    from gpugate.config.loader import ConfigError, load_config_with_warnings

    out = out or sys.stdout
    path = config_path or default_config_path()
    try:
        # Warnings are `gpugate check`'s business; status only needs the attribution rules.
        config = (
            load_config_with_warnings(path).config if path.exists() or config_path else Config()
        )
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return 2
    control = config.gate.control
    host = "127.0.0.1" if control.host in ("0.0.0.0", "::", "") else control.host
    url = f"http://{host}:{control.port}/gate/v1/status"
    document = asyncio.run(_from_gate(url))
    if document is None:
        try:
            document = direct_document(config)
        except RuntimeError as exc:
            print(f"gpugate status: {exc}", file=sys.stderr)
            return 1
    if as_json:
        json.dump(document, out, indent=2)
        out.write("\n")
    else:
        out.write(render_text(document) + "\n")
    return 0
