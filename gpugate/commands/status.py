"""`gpugate status`: the VRAM budget per GPU, as a person reads it or as JSON.

With a gate running, the numbers are the gate's own (leases, residents, queue). Without
one, NVML is sampled directly and the budget holds only what NVML shows. `--watch` asks
the running gate only, and redraws every second.

It is the one command that works without a configuration: the configuration is found as
every command finds it (gpugate.config.paths), and where none is (a host before `gpugate
init`), the gate is asked at the default control address, 127.0.0.1:9411, with this
user's local token of that port (a `gpugate demo`'s), and NVML is sampled when none
answers. A configuration that is named and not there is an error, as for every command.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import json
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

import aiohttp

from gpugate.commands.control_client import (
    Control,
    ControlFailure,
    Unreachable,
    call,
    control_endpoint,
    refusal,
    run_on_gate,
)
from gpugate.commands.exits import INTERRUPTED, Exit
from gpugate.config.paths import find_config_if_any
from gpugate.core.units import GiB, format_duration

if TYPE_CHECKING:
    from gpugate.config.model import Config

WATCH_INTERVAL = 1.0
CLEAR = "\x1b[H\x1b[2J"


def add_parser(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """The `status` subcommand's options."""
    status = subparsers.add_parser("status", help="the VRAM budget per GPU")
    status.add_argument("--json", action="store_true", help="machine-readable, in bytes")
    status.add_argument(
        "--config", type=Path,
        help="consumers.yaml: the control address and attribution (default: $GPUGATE_CONFIG, "
        "./consumers.yaml, /etc/gpugate/consumers.yaml, else none)",
    )  # fmt: skip
    status.add_argument(
        "--watch", action="store_true", help="redraw every second from the running gate"
    )


def run(args: argparse.Namespace) -> int:
    """`gpugate status`, or with `--watch` the running gate's status redrawn every second."""
    path = find_config_if_any(args.config)
    if args.watch:
        return run_watch(path, as_json=args.json)
    return run_status(config_path=path, as_json=args.json)


def _gib(nbytes: int) -> str:
    return f"{nbytes / GiB:5.1f} GiB"


def _since(since: float | None, seconds: float | None, by: str | None) -> str:
    """When and by whom, as much as is known: ` since 2026-07-10 14:02:11 (12m30s ago) by
    token`."""
    text = ""
    if since is not None:
        text = f" since {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(since))}"
        if seconds is not None:
            text += f" ({format_duration(seconds)} ago)"
    elif seconds is not None:
        text = f" for {format_duration(seconds)}"
    if by:
        text += f" by {by}"
    return text


def operator_lines(document: dict[str, Any]) -> list[str]:
    """One line for each pause and drain in force: what it does, since when, by whom, and
    the command that undoes it."""
    lines = []
    queue = document.get("queue") or []
    for gpu in document["gpus"]:
        if not gpu.get("paused"):
            continue
        index = gpu["index"]
        waiting = sum(1 for ticket in queue if ticket.get("gpu") == index)
        when = _since(gpu.get("paused_since"), gpu.get("paused_seconds"), gpu.get("paused_by"))
        undo = gpu.get("undo") or f"gpugate resume --gpu {index}"
        lines.append(
            f"PAUSED    GPU {index}{when}: new loads wait in its queue ({waiting} waiting);"
            f" undo: {undo}"
        )
    for consumer in document.get("consumers") or []:
        if not consumer.get("draining"):
            continue
        name = consumer["consumer"]
        state = "DRAINED" if consumer.get("drained") else "DRAINING"
        leases = consumer.get("leases", 0)
        held = f"{leases} lease(s) in flight" if leases else "no lease left"
        when = _since(
            consumer.get("draining_since"),
            consumer.get("draining_seconds"),
            consumer.get("draining_by"),
        )
        undo = consumer.get("undo") or f"gpugate undrain {name}"
        lines.append(f"{state:<9} {name}{when}: admits nothing new, {held}; undo: {undo}")
    return lines


def render_text(document: dict[str, Any]) -> str:
    """The budget table, one block per GPU, after a line for each pause and drain."""
    lines = []
    if document.get("source") == "nvml":
        lines.append(document.get("note", "no gate running: sampled NVML directly"))
    lines.extend(operator_lines(document))
    drains = {
        c["consumer"]: "DRAINED" if c.get("drained") else "DRAINING"
        for c in document.get("consumers") or []
        if c.get("draining")
    }
    for gpu in document["gpus"]:
        age = gpu.get("sample_age_seconds")
        age_text = "" if age is None else f"  sample {age:.1f}s old"
        paused = "  PAUSED" if gpu.get("paused") else ""
        lines.append(f"GPU {gpu['index']}  {gpu['name']}  {gpu['uuid']}{age_text}{paused}")
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
            drain = f"   {drains[name]}" if name in drains else ""
            lines.append(f"    {name:<24}{_gib(row['committed'])}{detail}{drain}")
            lines.extend(_models_on(document, gpu["index"], name))
        lines.append(f"  {'reserve':<26}{_gib(gpu['reserve'])}")
        lines.append(f"  {'schedulable':<26}{_gib(gpu['schedulable'])}")
    for section, title in (("leases", "leases"), ("queue", "waiting")):
        rows = document.get(section) or []
        if rows:
            # A waiting demand says what it waits for (`gpugate leases` says it at length).
            lines.append(
                f"{title}: "
                + ", ".join(
                    f"{r['consumer']}/{r['model']} ({r['class']}"
                    f"{', ' + r['reason'] if r.get('reason') else ''})"
                    for r in rows
                )
            )
    return "\n".join(lines)


def _models_on(document: dict[str, Any], index: int, consumer: str) -> list[str]:
    """The consumer's models on one GPU, a split model's part saying which GPUs it spans."""
    lines = []
    for r in document.get("residents") or []:
        if r.get("gpu") != index or r.get("consumer") != consumer:
            continue
        spans = r.get("spans")
        split = "" if not spans else "   split across GPUs " + ", ".join(map(str, spans))
        state = "" if r.get("state") == "resident" else f"   {r.get('state')}"
        lines.append(f"      {r['model']:<22}{_gib(r['bytes'])}{state}{split}")
    return lines


def direct_document(config: Config) -> dict[str, Any]:
    """Sample NVML in this process (no gate is running)."""
    from gpugate.control.status_document import SCHEMA, budget_document
    from gpugate.core.budget import compute_budget
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
            consumers=[c.name for c in config.consumers if device.index in c.cards],
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


async def _from_gate(base: str, token: str | None) -> dict[str, Any]:
    """The running gate's status document; Unreachable when no gate answers at `base`, and
    ControlFailure when one answers but refuses (an NVML budget in its place would show
    none of the gate's leases, as if no gate ran)."""
    timeout = aiohttp.ClientTimeout(total=2.0, sock_connect=0.5)
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with aiohttp.ClientSession(timeout=timeout, headers=headers) as session:
        status, document = await call(session, base, "GET", base + "/gate/v1/status")
    if status != 200 or not isinstance(document, dict):
        raise refusal(status, document)
    return document


def run_status(config_path: Path | None, *, as_json: bool, out: TextIO | None = None) -> int:
    """Print the budget: from the gate, else from NVML; the exit code is one of exits.py's.
    `config_path`: the configuration found, None for none (the defaults)."""
    from gpugate.config.loader import ConfigError
    from gpugate.config.model import Config
    from gpugate.runtimes.sections import load_config_with_warnings

    out = out or sys.stdout
    try:
        # Warnings are `gpugate check`'s business; status only needs the attribution rules.
        config = load_config_with_warnings(config_path).config if config_path else Config()
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return Exit.CONFIG
    base, token = control_endpoint(config)
    try:
        document = asyncio.run(_from_gate(base, token))
    except Unreachable as nobody:
        try:
            document = direct_document(config)
        except RuntimeError as exc:
            print(f"gpugate status: {nobody}, and NVML cannot be read here: {exc}", file=sys.stderr)
            return Exit.UNAVAILABLE
    except ControlFailure as exc:
        print(f"gpugate status: {exc}", file=sys.stderr)
        return exc.code
    if as_json:
        json.dump(document, out, indent=2)
        out.write("\n")
    else:
        out.write(render_text(document) + "\n")
    return Exit.OK


def run_watch(config_path: Path | None, *, as_json: bool, out: TextIO | None = None) -> int:
    """`gpugate status --watch`: the budget from the running gate, redrawn every second."""
    stream = out or sys.stdout

    async def watch(control: Control, session: aiohttp.ClientSession) -> None:
        first = True
        while True:
            try:
                document = await control.get(session, "/gate/v1/status")
                text = json.dumps(document) if as_json else render_text(document)
            except ControlFailure as exc:
                if first:
                    raise
                text = f"gpugate status: {exc}; retrying"
            first = False
            stamp = datetime.datetime.now().strftime("%H:%M:%S")
            if as_json:
                stream.write(text + "\n")
            else:
                stream.write(f"{CLEAR}gpugate status  {stamp}  (Ctrl-C to stop)\n{text}\n")
            stream.flush()
            await asyncio.sleep(WATCH_INTERVAL)

    with contextlib.suppress(KeyboardInterrupt):
        return run_on_gate("status", config_path, watch)
    return INTERRUPTED
