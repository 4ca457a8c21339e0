"""A simulated llama-server runner: the child process that holds a model's VRAM.

    python -m gpugate_sim.ollama.runner --state-dir D [--share GPU:BYTES ...] \\
        --load-seconds S [--name llama-server] [--fail LINE] -- llama-server --model BLOB ...

The words after `--` are only there to be seen in /proc/PID/cmdline, as a real runner's
are. The process allocates its share of each GPU (`--share`, once per GPU a split model
spans) on the simulated host under its own PID, in a few steps spread over the load time
(VRAM fills while a model loads), prints `READY` and then waits to be killed. NVML then
lists it on every GPU it holds memory on, each with that GPU's bytes. An allocation that
does not fit ends it with exit status 1 and the CUDA error on stderr, which is what the
server reports as the load failure.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import os
import signal
import sys
import time
from collections.abc import Sequence

from gpugate_sim.device import GpuOutOfMemory, SimulatedGpuHost

LOAD_STEPS = 4
_PR_SET_PDEATHSIG = 1
_PR_SET_NAME = 15


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m gpugate_sim.ollama.runner")
    parser.add_argument("--state-dir", required=True, help="the simulated GPU host's directory")
    parser.add_argument("--share", type=_share, action="append", default=[],
                        metavar="GPU:BYTES", help="VRAM to hold on a GPU once loaded")  # fmt: skip
    parser.add_argument("--load-seconds", type=float, default=0.0)
    parser.add_argument("--name", default="llama-server", help="process name (comm)")
    parser.add_argument("--fail", metavar="LINE", help="fail the load with this stderr line")
    parser.add_argument("command", nargs="*", help="the runner command line to show")
    return parser


def _share(text: str) -> tuple[int, int]:
    gpu, sep, nbytes = text.partition(":")
    if not sep or not gpu.isdigit() or not nbytes.isdigit():
        raise argparse.ArgumentTypeError(f"expected GPU:BYTES, got {text!r}")
    return int(gpu), int(nbytes)


def _prctl(option: int, arg: int | bytes) -> None:
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(option, arg, 0, 0, 0)


def _become_child_of(parent: int, name: str) -> None:
    # A runner must not outlive its server: a killed server would otherwise leave its
    # VRAM held by an orphan, which no real driver state would explain.
    _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:
        os._exit(1)
    _prctl(_PR_SET_NAME, name.encode()[:15])


def _load(host: SimulatedGpuHost, gpu: int, nbytes: int, seconds: float, name: str) -> None:
    """Hold `nbytes` on one GPU, filled over `seconds`."""
    _load_shares(host, ((gpu, nbytes),), seconds, name)


def _load_shares(
    host: SimulatedGpuHost, shares: Sequence[tuple[int, int]], seconds: float, name: str
) -> None:
    """Hold each (gpu, bytes) share, every GPU filling a step at a time over `seconds`."""
    shares = [(gpu, nbytes) for gpu, nbytes in shares if nbytes > 0]
    steps = LOAD_STEPS if shares else 0
    pid = os.getpid()
    done = dict.fromkeys((gpu for gpu, _ in shares), 0)
    for step in range(1, steps + 1):
        # Simulated load time: the bytes arrive over it, as weights stream onto the cards.
        time.sleep(seconds / (steps + 1))
        for gpu, nbytes in shares:
            target = nbytes * step // steps
            host.allocate(pid, target - done[gpu], gpu=gpu, name=name)
            done[gpu] = target
    time.sleep(seconds / (steps + 1) if steps else seconds)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    _become_child_of(os.getppid(), args.name)
    if args.fail:
        time.sleep(args.load_seconds / 2)
        print(args.fail, file=sys.stderr, flush=True)
        return 1
    host = SimulatedGpuHost(args.state_dir)
    try:
        _load_shares(host, args.share, args.load_seconds, args.name)
    except GpuOutOfMemory as exc:
        print(str(exc), file=sys.stderr, flush=True)
        return 1
    print("READY", flush=True)
    while True:
        signal.pause()


if __name__ == "__main__":
    sys.exit(main())
