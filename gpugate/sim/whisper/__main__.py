"""`python -m gpugate.sim.whisper -m MODEL --host H --port P [whisper-server options] [--sim-...]`.

Runs like whisper.cpp's `whisper-server`: the process names itself `whisper-server` and its
/proc cmdline reads `whisper-server` followed by the whisper-server options it was given
(the `--sim-*` options are dropped), so attribution rules match it as the real program.
It loads its model into the simulated GPU (found through `--sim-state-dir`, else the
directory of $GPUGATE_FAKE_NVML_STATE) **before** binding its port (SO_REUSEPORT, as
cpp-httplib binds: a second server on the same port starts too), then prints
`whisper server listening at http://H:P` on stdout — which, as C's stdout to a pipe, is
seen at exit (`stdio.py`); wait for the port instead. SIGTERM or SIGINT stops it (exit 0,
memory freed); a second one exits 1 at once. It is a plain process: it outlives whoever
started it.

A model that does not fit prints the ggml/whisper.cpp error lines and, by default, ends
the process with SIGABRT (`--sim-oom abort`: status 134 from a shell); `--sim-oom exit`
ends it as server.cpp does when `whisper_init_from_file_with_params` returns NULL:
`error: failed to initialize whisper context` and exit status 3. Either way the simulated
host records the OOM.

`-dev N` counts the GPUs CUDA shows the process: under CUDA_VISIBLE_DEVICES device 0 is the
first card listed (gpugate.sim.cuda). Shown no such device, it loads the model for the CPU
and serves anyway, holding nothing on any GPU, as whisper.cpp does.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TextIO

from aiohttp import web

from gpugate.core.units import parse_duration, parse_size
from gpugate.sim.cuda import NO_DEVICE_GGML, visible_devices
from gpugate.sim.device import SimulatedGpuHost
from gpugate.sim.holder import set_cmdline, set_comm
from gpugate.sim.shim import STATE_ENV
from gpugate.sim.whisper import stdio
from gpugate.sim.whisper.listening import httplib_runner
from gpugate.sim.whisper.model import (
    PROCESS_NAME,
    Context,
    ModelCatalog,
    ModelDoesNotFit,
    ModelMissing,
    NotAModel,
)
from gpugate.sim.whisper.record import WhisperRecords
from gpugate.sim.whisper.server import (
    LISTENING,
    N_THREADS,
    ServerOptions,
    WhisperServer,
    hard_exit,
)

EXIT_INIT_FAILED = 3
EXIT_BIND_FAILED = 1


def _model_size(text: str) -> tuple[str, int]:
    path, sep, size = text.rpartition("=")
    if not sep or not path:
        raise argparse.ArgumentTypeError(f"expected PATH=SIZE, got {text!r}")
    try:
        return path, parse_size(size)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m gpugate.sim.whisper", allow_abbrev=False)
    parser.add_argument("-m", "--model", default="models/ggml-base.en.bin")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument("--inference-path", default="/inference")
    parser.add_argument("--request-path", default="")
    parser.add_argument("-dev", "--device", type=int, default=None, help="GPU index")
    parser.add_argument("-t", "--threads", type=int, default=N_THREADS)
    parser.add_argument("-p", "--processors", type=int, default=1)
    sim = parser.add_argument_group("simulation (not shown in the process's command line)")
    sim.add_argument("--sim-state-dir", type=Path, help="the simulated GPU host's directory")
    sim.add_argument("--sim-model-size", type=_model_size, action="append", default=[],
                     metavar="PATH=SIZE", help="VRAM of a loaded model file")  # fmt: skip
    sim.add_argument("--sim-load-seconds", type=parse_duration, default=0.0)
    sim.add_argument("--sim-decode-seconds", type=parse_duration, default=0.0,
                     help="fixed decoding time of one request")  # fmt: skip
    sim.add_argument("--sim-decode-per-audio-second", type=float, default=0.0,
                     help="decoding seconds per second of audio")  # fmt: skip
    sim.add_argument("--sim-keepalive-timeout", type=parse_duration, default=5.0)
    sim.add_argument("--sim-keepalive-max", type=int, default=100)
    sim.add_argument("--sim-oom", choices=("abort", "exit"), default="abort")
    sim.add_argument("--sim-record", type=Path, metavar="PATH",
                     help="append a JSON line for every /load and /inference answer")  # fmt: skip
    return parser


def display_command(argv: Sequence[str]) -> list[str]:
    """`whisper-server` and the words of `argv` that are not `--sim-*` options."""
    shown = [PROCESS_NAME]
    skip = False
    for word in argv:
        if skip:
            skip = False
            continue
        if word.startswith("--sim-"):
            skip = "=" not in word
            continue
        shown.append(word)
    return shown


def _unblock_stop_signals() -> None:
    # A launcher's blocked stop signals are inherited across exec; stop() must still work.
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM, signal.SIGINT})


def _ordinal(args: argparse.Namespace) -> int:
    """The CUDA device asked for: `-dev`, else WHISPER_ARG_DEVICE, else 0."""
    if args.device is not None:
        return int(args.device)
    return int(os.environ.get("WHISPER_ARG_DEVICE", "0") or 0)


def _cuda(host: SimulatedGpuHost, ordinal: int, err: TextIO) -> int | None:
    """The host GPU that CUDA device is, under this process's CUDA_VISIBLE_DEVICES; None
    when it has no such device, and the model then goes to the CPU."""
    seen = visible_devices(host.read().devices)
    if seen.none:
        err.write(NO_DEVICE_GGML + "\n")
        err.flush()
    return seen.host_gpu(ordinal)


def _oom(lines: list[str], mode: str) -> int:
    for line in lines:
        print(line, file=sys.stderr)
    if mode == "exit":
        print("error: failed to initialize whisper context", file=sys.stderr, flush=True)
        return EXIT_INIT_FAILED
    print("CUDA error: out of memory", file=sys.stderr, flush=True)
    # abort() flushes no stdio buffer.
    signal.signal(signal.SIGABRT, signal.SIG_DFL)
    os.abort()


async def _serve(server: WhisperServer, options: ServerOptions) -> int:
    # cpp-httplib decodes no body itself (built without compression): the framing middleware
    # answers an encoded one, so aiohttp must not inflate or refuse it first.
    runner = httplib_runner(server.handle, keepalive_timeout=options.keepalive_timeout)
    await runner.setup()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()

    def on_signal(signum: int) -> None:
        if stop.is_set():
            print("Received second interrupt, terminating immediately.", file=sys.stderr)
            hard_exit(1)
        stop.set()
        print(f"\nCaught signal {signum}, shutting down gracefully...")

    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, on_signal, signum)
    # cpp-httplib's default_socket_options: SO_REUSEPORT alone.
    site = web.TCPSite(runner, options.host, options.port, reuse_address=False, reuse_port=True)
    try:
        await site.start()
    except OSError:
        print(f"\ncouldn't bind to server socket: hostname={options.host} port={options.port}\n",
              file=sys.stderr, flush=True)  # fmt: skip
        await runner.cleanup()
        return EXIT_BIND_FAILED
    # printf of the port it was given (0 stays 0), left in stdout's buffer.
    print(f"\n{LISTENING} http://{options.host}:{options.port}\n")
    try:
        await stop.wait()
    finally:
        await runner.cleanup()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Run a simulated whisper-server; the exit code."""
    words = list(sys.argv[1:] if argv is None else argv)
    args, unknown = _parser().parse_known_args(words)
    if unknown:
        # whisper_params_parse: the first unknown word, the usage, and exit(0).
        print(f"error: unknown argument: {unknown[0]}", file=sys.stderr)
        print(f"\nusage: {PROCESS_NAME} [options] \n", file=sys.stderr)
        return 0
    state_dir = args.sim_state_dir
    if state_dir is None and os.environ.get(STATE_ENV):
        state_dir = Path(os.environ[STATE_ENV]).parent
    if state_dir is None or not SimulatedGpuHost(state_dir).state_path.exists():
        print(f"error: no simulated GPU host (--sim-state-dir or ${STATE_ENV})", file=sys.stderr)
        return 2
    _unblock_stop_signals()
    out, err = stdio.install()
    set_comm(PROCESS_NAME)
    set_cmdline(display_command(words))
    options = ServerOptions(
        host=args.host,
        port=args.port,
        inference_path=args.inference_path,
        request_path=args.request_path,
        keepalive_timeout=args.sim_keepalive_timeout,
        keepalive_max=args.sim_keepalive_max,
        decode_seconds=args.sim_decode_seconds,
        decode_per_audio_second=args.sim_decode_per_audio_second,
        threads=args.threads,
        processors=args.processors,
    )
    gpu_host = SimulatedGpuHost(state_dir)
    ordinal = _ordinal(args)
    context = Context(
        gpu_host,
        ModelCatalog(dict(args.sim_model_size)),
        gpu=_cuda(gpu_host, ordinal, err),
        ordinal=ordinal,
        load_seconds=args.sim_load_seconds,
        err=err,
    )
    try:
        context.init(args.model)
    except (ModelMissing, NotAModel):
        print("error: failed to initialize whisper context", file=sys.stderr, flush=True)
        return EXIT_INIT_FAILED
    except ModelDoesNotFit as exc:
        return _oom(exc.lines, args.sim_oom)
    records = WhisperRecords(args.sim_record) if args.sim_record is not None else None
    try:
        server = WhisperServer(context, options, out=out, records=records)
        return asyncio.run(_serve(server, options))
    finally:
        context.free()
        if records is not None:
            records.close()


if __name__ == "__main__":
    sys.exit(main())
