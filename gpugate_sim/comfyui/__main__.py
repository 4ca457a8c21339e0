"""`python -m gpugate_sim.comfyui serve --host-file HOST.yaml --state-dir DIR`.

Serves the `comfyui:` part of HOST.yaml against the simulated GPU in DIR. The process
takes ComfyUI's name and command line (`python3 ComfyUI/main.py --listen H --port P`) and
holds the VRAM under its own PID, as the one Python process of a real ComfyUI does. Prints
`READY http://HOST:PORT` once listening and runs until SIGTERM or SIGINT. `--cuda-device N`
(else `comfyui.gpu`) picks the card as ComfyUI's own option does; without either, the
CUDA_VISIBLE_DEVICES it inherits decides. ComfyUI's memory options (`--reserve-vram GB`,
`--vram-headroom GB`, `--enable-dynamic-vram`, `--disable-dynamic-vram`,
`--disable-smart-memory`) override the host file's.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from pathlib import Path
from typing import Any

import attrs

from gpugate_sim.holder import die_with_parent
from gpugate_sim.hostpart import HostFileError, host_file_parser, read_part, serve_part
from gpugate_sim.serving import EXIT_USAGE


async def _serve(
    host_file: Path,
    state_dir: Path,
    listen: str | None,
    cuda_device: int | None,
    memory: dict[str, Any],
) -> int:
    from gpugate_sim.comfyui.memory import TorchOutOfMemory
    from gpugate_sim.comfyui.server import NoCudaDevice, SimComfyUI, split_listen

    try:
        spec, gpu = read_part(host_file, state_dir, "comfyui")
    except HostFileError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if cuda_device is not None:
        spec = attrs.evolve(spec, gpu=cuda_device)
    spec = attrs.evolve(spec, **memory)
    try:
        host, port = split_listen(listen or spec.listen)
    except ValueError as exc:
        print(f"error: {host_file}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    sim = SimComfyUI(spec, gpu, pid=os.getpid(), data_dir=state_dir / "comfyui")

    def describe(exc: Exception) -> str:
        # PyTorch's own words end the traceback of a ComfyUI that sees no CUDA device.
        return f"RuntimeError: {exc}" if isinstance(exc, NoCudaDevice) else f"error: {exc}"

    failures = (OSError, RuntimeError, TorchOutOfMemory)
    return await serve_part(sim, host, port, host_file, failures, describe)


def main(argv: list[str] | None = None) -> int:
    args = command_parser().parse_args(argv)
    die_with_parent()
    memory = memory_overrides(args)
    return asyncio.run(
        _serve(args.host_file, args.state_dir, args.listen, args.cuda_device, memory)
    )


def command_parser() -> argparse.ArgumentParser:
    """`serve`'s options: the host file's, `--cuda-device` and ComfyUI's memory options."""
    parser, serve = host_file_parser("ComfyUI", "comfyui")
    serve.add_argument(
        "--cuda-device", type=int, help="ComfyUI's --cuda-device N, overriding comfyui.gpu"
    )
    # comfy/cli_args.py's memory options, parsed as ComfyUI parses them.
    serve.add_argument(
        "--reserve-vram",
        type=float,
        default=None,
        help="GB of VRAM to leave for other software (× 1024³)",
    )
    serve.add_argument(
        "--vram-headroom",
        type=float,
        default=None,
        help="GB Dynamic VRAM keeps free beyond its own 256 MiB",
    )
    serve.add_argument("--enable-dynamic-vram", action="store_true")
    serve.add_argument("--disable-dynamic-vram", action="store_true")
    serve.add_argument("--disable-smart-memory", action="store_true")
    return parser


def memory_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """The ComfyUISpec fields the command line's memory options set. As comfy/cli_args.py
    `enables_dynamic_vram`, --enable-dynamic-vram wins over --disable-dynamic-vram."""
    fields: dict[str, Any] = {}
    if args.reserve_vram is not None:
        fields["reserve_vram"] = args.reserve_vram
    if args.vram_headroom is not None:
        fields["vram_headroom"] = args.vram_headroom
    if args.enable_dynamic_vram:
        fields["dynamic_vram"] = True
    elif args.disable_dynamic_vram:
        fields["dynamic_vram"] = False
    if args.disable_smart_memory:
        fields["disable_smart_memory"] = True
    return fields


if __name__ == "__main__":
    sys.exit(main())
