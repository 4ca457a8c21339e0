"""`python -m gpugate_sim.ollama serve --host-file HOST.yaml --state-dir DIR`.

Serves the `ollama:` part of HOST.yaml against the simulated GPU in DIR, prints
`READY http://HOST:PORT` (flushed) once listening and preloaded, and runs until SIGTERM
or SIGINT, when it kills its runner children and exits 0.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from pathlib import Path

from gpugate_sim.device import SimulatedGpuHost
from gpugate_sim.scenario import ScenarioError, load_host


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m gpugate_sim.ollama")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="serve the simulated Ollama of a HOST.yaml")
    serve.add_argument("--host-file", type=Path, required=True, help="HOST.yaml")
    serve.add_argument(
        "--state-dir", type=Path, required=True, help="the simulated GPU host's directory"
    )
    serve.add_argument("--listen", help="HOST:PORT, overriding ollama.listen")
    return parser


async def _serve(host_file: Path, state_dir: Path, listen: str | None) -> int:
    from gpugate_sim.ollama.server import PreloadError, SimOllama, split_listen

    try:
        spec = load_host(host_file).ollama
    except ScenarioError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if spec is None:
        print(f"error: {host_file}: no `ollama:` section", file=sys.stderr)
        return 2
    gpu = SimulatedGpuHost(state_dir)
    if not gpu.state_path.exists():
        print(
            f"error: {state_dir}: no simulated GPU state ({gpu.state_path.name})", file=sys.stderr
        )
        return 2
    try:
        host, port = split_listen(listen or spec.listen)
        sim = SimOllama(spec, gpu)
    except ValueError as exc:
        print(f"error: {host_file}: {exc}", file=sys.stderr)
        return 2
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    # A launcher's blocked stop signals are inherited across exec: take them back.
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM, signal.SIGINT})
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    try:
        url = await sim.start(host, port)
    except ValueError as exc:
        print(f"error: {host_file}: {exc}", file=sys.stderr)
        return 2
    except (OSError, PreloadError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"READY {url}", flush=True)
    try:
        await stop.wait()
    finally:
        await sim.close()
    return 0


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    return asyncio.run(_serve(args.host_file, args.state_dir, args.listen))


if __name__ == "__main__":
    sys.exit(main())
