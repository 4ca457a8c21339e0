"""`python -m gpugate_sim.llamaserver [llama-server options] [--sim-...]`.

Runs like llama.cpp's `llama-server` (tools/server/server.cpp): with `-m FILE` one model,
loaded after the port is bound (`/health` answers 503 `Loading model` meanwhile) and held
in the simulated GPU until exit; without `-m`, router mode: `--models-dir DIR` lists
models, each loaded in a child process of its own (the same program, `-m PATH --host
127.0.0.1 --port P --alias NAME`), as server-models.cpp does. The process names itself
`llama-server`, and its /proc cmdline shows its llama-server options (not the `--sim-*`
ones). SIGTERM/SIGINT stop it (status 0); a second one exits 1 at once.

`-dev CUDA<n>` counts the GPUs CUDA shows the process (under CUDA_VISIBLE_DEVICES, CUDA0 is
the first card listed; gpugate_sim.cuda). A `-dev` naming one it is not shown is refused at
start; shown none and given no `-dev`, it serves from the CPU.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Sequence

from gpugate_sim.cuda import NO_DEVICE_GGML, visible_devices
from gpugate_sim.device import SimulatedGpuHost
from gpugate_sim.holder import pose_as
from gpugate_sim.llamaserver.cli import Args, parse_args
from gpugate_sim.llamaserver.memory import PROCESS_NAME
from gpugate_sim.llamaserver.single import run_single
from gpugate_sim.serving import state_dir_of, take_back_stop_signals

EXIT_USAGE = 1


def _see_devices(args: Args, host: SimulatedGpuHost) -> str | None:
    """Learn which GPUs CUDA shows this process; llama.cpp's refusal of `-dev` when it
    names a device CUDA does not show (common/arg.cpp `parse_device_list`)."""
    args.visible = visible_devices(host.read().devices)
    if args.visible.none:
        # ggml's CUDA backend registers no device and says why; the CPU remains.
        print(NO_DEVICE_GGML, file=sys.stderr, flush=True)
    named = args.named_device
    if named is not None and args.gpu is None:
        return f'error while handling argument "-dev": invalid device: {named}'
    return None


def main(argv: Sequence[str] | None = None) -> int:
    """Run a simulated llama-server; the exit code."""
    words = list(sys.argv[1:] if argv is None else argv)
    try:
        args = parse_args(words)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    take_back_stop_signals()
    pose_as(PROCESS_NAME, words)
    state_dir = state_dir_of(args.sim_state_dir)
    if state_dir is not None and SimulatedGpuHost(state_dir).state_path.exists():
        refusal = _see_devices(args, SimulatedGpuHost(state_dir))
        if refusal is not None:
            print(refusal, file=sys.stderr)
            return EXIT_USAGE
    if args.model is None:
        from gpugate_sim.llamaserver.router import run_router

        return asyncio.run(run_router(args, state_dir, words))
    return run_single(args, state_dir)


if __name__ == "__main__":
    sys.exit(main())
