"""A part of HOST.yaml served in this process, the simulated Ollama's and ComfyUI's way:
`python -m gpugate_sim.PART serve --host-file HOST.yaml --state-dir DIR [--listen H:P]`
reads its part of the host file, serves it on the simulated GPU in DIR, prints `READY URL`
once it serves, and runs until a stop signal (serving.py)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from gpugate_sim.device import SimulatedGpuHost
from gpugate_sim.scenario import ScenarioError, load_host
from gpugate_sim.serving import EXIT_USAGE, serve_until_signal


class HostFileError(Exception):
    """The host file, its part for this server, or the simulated GPU is not there."""


class PartServer(Protocol):
    """A simulated server of one part of HOST.yaml, run in this process."""

    async def start(self, host: str | None = None, port: int | None = None) -> str: ...

    async def close(self) -> None: ...


def host_file_parser(runtime: str, part: str) -> tuple[argparse.ArgumentParser, Any]:
    """`python -m gpugate_sim.PART serve --host-file HOST.yaml --state-dir DIR [--listen]`;
    the parser and its `serve` subcommand, for options of the server's own."""
    parser = argparse.ArgumentParser(prog=f"python -m gpugate_sim.{part}")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help=f"serve the simulated {runtime} of a HOST.yaml")
    serve.add_argument("--host-file", type=Path, required=True, help="HOST.yaml")
    serve.add_argument(
        "--state-dir", type=Path, required=True, help="the simulated GPU host's directory"
    )
    serve.add_argument("--listen", help=f"HOST:PORT, overriding {part}.listen")
    return parser, serve


def read_part(host_file: Path, state_dir: Path, part: str) -> tuple[Any, SimulatedGpuHost]:
    """The `part:` section of `host_file` and the simulated GPU in `state_dir`;
    HostFileError when either is not there."""
    try:
        spec = getattr(load_host(host_file), part)
    except ScenarioError as exc:
        raise HostFileError(str(exc)) from None
    if spec is None:
        raise HostFileError(f"{host_file}: no `{part}:` section")
    gpu = SimulatedGpuHost(state_dir)
    if not gpu.state_path.exists():
        raise HostFileError(f"{state_dir}: no simulated GPU state ({gpu.state_path.name})")
    return spec, gpu


async def serve_part(
    server: PartServer,
    host: str,
    port: int,
    host_file: Path,
    failures: tuple[type[Exception], ...],
    describe: Callable[[Exception], str] = lambda exc: f"error: {exc}",
) -> int:
    """Serve `server` on host:port until a stop signal, printing `READY URL` (flushed) once
    it serves. A ValueError at its start is the host file's (exit 2); one of `failures` the
    server's own, said as `describe` words it (exit 1)."""

    async def start() -> int | None:
        try:
            url = await server.start(host, port)
        except ValueError as exc:
            print(f"error: {host_file}: {exc}", file=sys.stderr)
            return EXIT_USAGE
        except failures as exc:
            print(describe(exc), file=sys.stderr)
            return 1
        print(f"READY {url}", flush=True)
        return None

    return await serve_until_signal(start, server.close)
