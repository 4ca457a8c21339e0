"""`python -m gpugate_sim.comfyui serve --host-file HOST.yaml --state-dir DIR`.

Serves the `comfyui:` part of HOST.yaml against the simulated GPU in DIR. The process
takes ComfyUI's name and command line (`python3 ComfyUI/main.py --listen H --port P`) and
holds the VRAM under its own PID, as the one Python process of a real ComfyUI does. Prints
`READY http://HOST:PORT` once listening and runs until SIGTERM or SIGINT. `--cuda-device N`
(else `comfyui.gpu`) picks the card as ComfyUI's own option does; without either, the
CUDA_VISIBLE_DEVICES it inherits decides.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
from pathlib import Path

import attrs

from gpugate_sim.device import SimulatedGpuHost
from gpugate_sim.holder import die_with_parent
from gpugate_sim.scenario import ScenarioError, load_host


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m gpugate_sim.comfyui")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="serve the simulated ComfyUI of a HOST.yaml")
    serve.add_argument("--host-file", type=Path, required=True, help="HOST.yaml")
    serve.add_argument("--state-dir", type=Path, required=True, help="the simulated GPU's dir")
    serve.add_argument("--listen", help="HOST:PORT, overriding comfyui.listen")
    serve.add_argument(
        "--cuda-device", type=int, help="ComfyUI's --cuda-device N, overriding comfyui.gpu"
    )
    return parser


async def _serve(
    host_file: Path, state_dir: Path, listen: str | None, cuda_device: int | None
) -> int:
    from gpugate_sim.comfyui.memory import TorchOutOfMemory
    from gpugate_sim.comfyui.server import NoCudaDevice, SimComfyUI, split_listen

    try:
        spec = load_host(host_file).comfyui
    except ScenarioError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if spec is None:
        print(f"error: {host_file}: no `comfyui:` section", file=sys.stderr)
        return 2
    if cuda_device is not None:
        spec = attrs.evolve(spec, gpu=cuda_device)
    gpu = SimulatedGpuHost(state_dir)
    if not gpu.state_path.exists():
        print(
            f"error: {state_dir}: no simulated GPU state ({gpu.state_path.name})", file=sys.stderr
        )
        return 2
    try:
        host, port = split_listen(listen or spec.listen)
    except ValueError as exc:
        print(f"error: {host_file}: {exc}", file=sys.stderr)
        return 2
    sim = SimComfyUI(spec, gpu, pid=os.getpid(), data_dir=state_dir / "comfyui")
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
    except NoCudaDevice as exc:
        print(f"RuntimeError: {exc}", file=sys.stderr)
        return 1
    except (OSError, RuntimeError, TorchOutOfMemory) as exc:
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
    die_with_parent()
    return asyncio.run(_serve(args.host_file, args.state_dir, args.listen, args.cuda_device))


if __name__ == "__main__":
    sys.exit(main())
