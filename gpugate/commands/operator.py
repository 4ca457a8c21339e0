"""Operator actions from the shell: `gpugate evict`, `drain`, `undrain`, `pause`, `resume`.

Each is one POST to the control API with the control token (found as `gpugate lease`
finds it). It prints one line of what the gate did; an error is one line on stderr, the
failure class first, with the exit code for what it means (exits.py): 65 for no
such consumer, resident or GPU, or an `always_warm` one without --force; 75 for a
resident busy now; 69 when no gate answers; 77 for a token it refuses.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path
from typing import Any
from urllib.parse import quote

import aiohttp

from gpugate.commands.control_client import (
    ControlFailure,
    call,
    control_address,
    control_session,
    refusal,
)
from gpugate.commands.exits import Exit
from gpugate.config.paths import find_config


def add_parser(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """The `evict`, `drain`, `undrain`, `pause` and `resume` subcommands."""
    evict = subparsers.add_parser("evict", help="unload an idle resident model now")
    evict.add_argument("consumer")
    evict.add_argument("model")
    evict.add_argument("--force", action="store_true", help="evict an always_warm model too")
    drain = subparsers.add_parser(
        "drain", help="a consumer admits nothing new; in-flight work ends"
    )
    undrain = subparsers.add_parser("undrain", help="a drained consumer admits again")
    for parser in (drain, undrain):
        parser.add_argument("consumer")
    pause = subparsers.add_parser("pause", help="pause admission (new requests wait in the queue)")
    resume = subparsers.add_parser("resume", help="resume admission")
    for parser in (pause, resume):
        parser.add_argument("--gpu", type=int, help="one GPU (default: every GPU)")
    for parser in (evict, drain, undrain, pause, resume):
        parser.add_argument("--config", type=Path, help="consumers.yaml (the control address)")


async def _call(session: aiohttp.ClientSession, url: str, path: str) -> dict[str, Any]:
    method = "POST" if path else "GET"
    status, answer = await call(session, url, method, path or "/gate/v1/status")
    if status >= 300 or not isinstance(answer, dict):
        raise refusal(status, answer)
    return answer


def _paths(args: argparse.Namespace, gpus: list[int]) -> list[str]:
    if args.command == "evict":
        model = quote(args.model, safe=":")
        force = "?force=1" if args.force else ""
        return [f"/gate/v1/residents/{quote(args.consumer)}/{model}/evict{force}"]
    if args.command in ("drain", "undrain"):
        return [f"/gate/v1/consumers/{quote(args.consumer)}/{args.command}"]
    return [f"/gate/v1/gpus/{gpu}/{args.command}" for gpu in gpus]


def _line(args: argparse.Namespace, answer: dict[str, Any]) -> str:
    if args.command == "evict":
        key = answer["key"]
        if answer.get("loaded") is False:
            return f"{key['consumer']}/{key['model']} is not loaded: nothing to evict"
        return f"evicting {key['consumer']}/{key['model']} (eviction_done follows)"
    if args.command in ("drain", "undrain"):
        state = "admitting"
        if answer["draining"]:
            state = "drained" if answer["drained"] else "draining"
        return f"{answer['consumer']}: {state} ({answer['leases']} lease(s) in flight)"
    return f"GPU {answer['gpu']}: {'paused' if answer['paused'] else 'admitting'}"


async def _run(args: argparse.Namespace, url: str, token: str | None) -> list[str]:
    async with control_session(url, token) as session:
        gpus: list[int] = []
        if args.command in ("pause", "resume"):
            if args.gpu is not None:
                gpus = [args.gpu]
            else:
                status = await _call(session, url, "")
                gpus = [gpu["index"] for gpu in status.get("gpus", [])]
        return [_line(args, await _call(session, url, path)) for path in _paths(args, gpus)]


def run(args: argparse.Namespace) -> int:
    """Run one operator action; 0 when the gate did it."""
    from gpugate.config.loader import ConfigError

    config_path = find_config(args.config)
    try:
        url, token = control_address(config_path)
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return Exit.CONFIG
    try:
        lines = asyncio.run(_run(args, url, token))
    except ControlFailure as exc:
        print(f"gpugate {args.command}: {exc}", file=sys.stderr)
        return exc.code
    for line in lines:
        print(line)
    return Exit.OK
