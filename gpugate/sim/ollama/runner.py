"""A simulated llama-server runner: the child process that holds a model's VRAM.

    python -m gpugate.sim.ollama.runner --state-dir D --gpu G --bytes N --load-seconds S \\
        [--name llama-server] [--fail MESSAGE] -- llama-server --model BLOB --port P ...

The words after `--` are only there to be seen in /proc/PID/cmdline, as a real runner's
are. The process allocates its bytes on the simulated GPU under its own PID in a few
steps spread over the load time (VRAM fills while a model loads), prints `READY` and
then waits to be killed. An allocation that does not fit ends it with exit status 1 and
the CUDA error on stderr, which is what the server reports as the load failure.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import os
import signal
import sys
import time

from gpugate.sim.device import GpuOutOfMemory, SimulatedGpuHost

LOAD_STEPS = 4
_PR_SET_PDEATHSIG = 1
_PR_SET_NAME = 15


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m gpugate.sim.ollama.runner")
    parser.add_argument("--state-dir", required=True, help="the simulated GPU host's directory")
    parser.add_argument("--gpu", type=int, default=0)
    parser.add_argument("--bytes", type=int, required=True, help="VRAM to hold once loaded")
    parser.add_argument("--load-seconds", type=float, default=0.0)
    parser.add_argument("--name", default="llama-server", help="process name (comm)")
    parser.add_argument("--fail", metavar="MESSAGE", help="fail the load with this error")
    parser.add_argument("command", nargs="*", help="the runner command line to show")
    return parser


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
    steps = LOAD_STEPS if nbytes > 0 else 0
    pid = os.getpid()
    done = 0
    for step in range(1, steps + 1):
        # Simulated load time: the bytes arrive over it, as weights stream onto the card.
        time.sleep(seconds / (steps + 1))
        target = nbytes * step // steps
        host.allocate(pid, target - done, gpu=gpu, name=name)
        done = target
    time.sleep(seconds / (steps + 1) if steps else seconds)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    _become_child_of(os.getppid(), args.name)
    if args.fail:
        time.sleep(args.load_seconds / 2)
        print(f"error loading model: {args.fail}", file=sys.stderr, flush=True)
        return 1
    host = SimulatedGpuHost(args.state_dir)
    try:
        _load(host, args.gpu, args.bytes, args.load_seconds, args.name)
    except GpuOutOfMemory as exc:
        print(str(exc), file=sys.stderr, flush=True)
        return 1
    print("READY", flush=True)
    while True:
        signal.pause()


if __name__ == "__main__":
    sys.exit(main())
