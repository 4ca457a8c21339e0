"""`python -m gpugate_sim.vllm serve MODEL [vllm serve options] [--sim-...]`.

Runs like `vllm serve`: the process names itself `vllm` and its /proc cmdline reads `vllm
serve MODEL ...` with the `--sim-*` options dropped, so attribution rules match it as the
real program. It takes its memory on the simulated GPU (found through `--sim-state-dir`,
else the directory of $GPUGATE_FAKE_NVML_STATE) under its own PID — the CUDA context, then
the free-memory check, then weights, activations and KV cache up to
`--gpu-memory-utilization` of the card's total — and only then serves its port. A failed
start prints vLLM's error and `RuntimeError: Engine core initialization failed...` and exits
1. SIGTERM or SIGINT stops it (exit 0, memory freed).

Its card is the first one CUDA_VISIBLE_DEVICES shows it (GPU 0 without it; `--sim-gpu N`
overrides); shown none, it stops at start with PyTorch's "No CUDA GPUs are available".

The sleep routes exist only when VLLM_SERVER_DEV_MODE=1 is in its environment; they free
memory only with --enable-sleep-mode.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from gpugate.core.units import parse_duration, parse_size
from gpugate_sim.cuda import NO_DEVICE_TORCH, visible_devices
from gpugate_sim.device import SimulatedGpuHost
from gpugate_sim.serving import AppSite, begin, serve_until_signal
from gpugate_sim.vllm.engine import PROCESS_NAME, Engine, Plan, StartupFailed
from gpugate_sim.vllm.server import ServerOptions, VllmServer
from gpugate_sim.vllm.spec import DEV_MODE_ENV, RUNNERS, VllmServerSpec

EXIT_FAILED = 1
STARTING = "Starting vLLM server on"


def _size(text: str) -> int:
    try:
        return parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _seconds(text: str) -> float:
    try:
        return parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _parser() -> argparse.ArgumentParser:
    d = VllmServerSpec()
    parser = argparse.ArgumentParser(prog="python -m gpugate_sim.vllm", allow_abbrev=False)
    parser.add_argument("command", choices=("serve",))
    parser.add_argument("model", nargs="?", default=d.model)
    parser.add_argument("--model", dest="model_option", default=None)
    parser.add_argument("--host", default=None)
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--served-model-name", nargs="+", default=None)
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    parser.add_argument("--max-model-len", type=int, default=None)
    parser.add_argument("--enable-sleep-mode", action="store_true")
    parser.add_argument("--runner", choices=RUNNERS, default="auto")
    sim = parser.add_argument_group("simulation (not shown in the process's command line)")
    sim.add_argument("--sim-state-dir", type=Path, help="the simulated GPU host's directory")
    sim.add_argument("--sim-gpu", type=int, default=None,
                     help="GPU index (default: CUDA_VISIBLE_DEVICES's first, else 0)")  # fmt: skip
    sim.add_argument("--sim-weights", type=_size, default=d.weights)
    sim.add_argument("--sim-context", type=_size, default=d.context)
    sim.add_argument("--sim-overhead", type=_size, default=d.overhead)
    sim.add_argument("--sim-model-len", type=int, default=d.model_len)
    sim.add_argument("--sim-kv-bytes-per-token", type=_size, default=0)
    sim.add_argument("--sim-load-seconds", type=_seconds, default=0.0)
    sim.add_argument("--sim-init-seconds", type=_seconds, default=0.0)
    sim.add_argument("--sim-sleep-seconds", type=_seconds, default=0.0)
    sim.add_argument("--sim-wake-seconds", type=_seconds, default=0.0)
    sim.add_argument("--sim-tokens-per-second", type=float, default=d.tokens_per_second)
    sim.add_argument("--sim-version", default=d.version)
    return parser


def _gpu(args: argparse.Namespace, host: SimulatedGpuHost) -> int | None:
    """The host GPU that is its `cuda:0`: `--sim-gpu`, else the first one CUDA_VISIBLE_DEVICES
    shows (GPU 0 without it); None when CUDA shows it no GPU."""
    if args.sim_gpu is not None:
        return int(args.sim_gpu)
    return visible_devices(host.read().devices).host_gpu(0)


def dev_mode(environ: dict[str, str] | os._Environ[str] = os.environ) -> bool:
    """vllm/envs.py: `bool(int(os.getenv("VLLM_SERVER_DEV_MODE", "0")))`."""
    try:
        return bool(int(environ.get(DEV_MODE_ENV, "0")))
    except ValueError:
        return False


def _log(line: str) -> None:
    # vLLM's logger writes to stdout; a line at a time, as logging flushes each record.
    stamp = time.strftime("%m-%d %H:%M:%S")
    print(f"(APIServer pid={os.getpid()}) INFO {stamp} {line}", flush=True)


async def _serve(server: VllmServer, host: str | None, port: int) -> int:
    def bind_failed(exc: OSError) -> int:
        print(f"OSError: [Errno {exc.errno}] {exc.strerror}", file=sys.stderr, flush=True)
        return EXIT_FAILED

    def listening() -> None:
        _log(f"[api_server.py] {STARTING} http://{host or '0.0.0.0'}:{port}")
        print("INFO:     Application startup complete.", file=sys.stderr, flush=True)

    # create_server_socket: SO_REUSEADDR and SO_REUSEPORT; "" binds every address.
    site = AppSite(
        server.app,
        host or "0.0.0.0",
        port,
        bind_failed=bind_failed,
        listening=listening,
        reuse_address=True,
        reuse_port=True,
        keepalive_timeout=5.0,
    )
    return await serve_until_signal(site.start, site.close)


def main(argv: Sequence[str] | None = None) -> int:
    """Run a simulated `vllm serve`; the exit code."""
    args, gpu_host = begin(_parser(), PROCESS_NAME, argv)
    model = args.model_option or args.model
    max_model_len = args.max_model_len or args.sim_model_len
    gpu = _gpu(args, gpu_host)
    if gpu is None:
        # PyTorch's first CUDA call in the engine core fails; the server never starts.
        print(NO_DEVICE_TORCH, file=sys.stderr, flush=True)
        return EXIT_FAILED
    plan = Plan(
        gpu=gpu,
        utilization=args.gpu_memory_utilization,
        context=args.sim_context,
        overhead=args.sim_overhead,
        weights=args.sim_weights,
        max_model_len=max_model_len,
        kv_bytes_per_token=args.sim_kv_bytes_per_token,
        load_seconds=args.sim_load_seconds,
        init_seconds=args.sim_init_seconds,
        sleep_seconds=args.sim_sleep_seconds,
        wake_seconds=args.sim_wake_seconds,
    )
    _log(f"[utils.py] vLLM API server version {args.sim_version}")
    engine = Engine(gpu_host, plan, sleep_mode=args.enable_sleep_mode)
    try:
        engine.start(lambda line: _log(f"(EngineCore) {line}"))
    except StartupFailed as exc:
        for line in ["ERROR EngineCore failed to start.", *exc.lines]:
            print(line, file=sys.stderr)
        print("RuntimeError: Engine core initialization failed. See root cause above. "
              "Failed core proc(s): {}", file=sys.stderr, flush=True)  # fmt: skip
        return EXIT_FAILED
    options = ServerOptions(
        names=tuple(args.served_model_name or (model,)),
        model=model,
        max_model_len=max_model_len,
        pooling=args.runner == "pooling",
        dev_mode=dev_mode(),
        tokens_per_second=args.sim_tokens_per_second,
        version=args.sim_version,
    )
    try:
        server = VllmServer(engine, options, err=sys.stderr)
        return asyncio.run(_serve(server, args.host, args.port))
    finally:
        engine.free_all()


if __name__ == "__main__":
    sys.exit(main())
