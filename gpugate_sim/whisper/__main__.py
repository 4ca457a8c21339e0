"""`python -m gpugate_sim.whisper -m MODEL --host H --port P [whisper-server options] [--sim-...]`.

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
first card listed (gpugate_sim.cuda). Shown no such device, it loads the model for the CPU
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

from gpugate.core.units import parse_duration, parse_size
from gpugate_sim.cuda import NO_DEVICE_GGML, visible_devices
from gpugate_sim.device import SimulatedGpuHost
from gpugate_sim.serving import AppSite, begin, serve_until_signal
from gpugate_sim.whisper import stdio
from gpugate_sim.whisper.listening import httplib_runner
from gpugate_sim.whisper.model import (
    PROCESS_NAME,
    Context,
    ModelCatalog,
    ModelDoesNotFit,
    ModelMissing,
    NotAModel,
)
from gpugate_sim.whisper.record import WhisperRecords
from gpugate_sim.whisper.server import (
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
    parser = argparse.ArgumentParser(prog="python -m gpugate_sim.whisper", allow_abbrev=False)
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
    def bind_failed(exc: OSError) -> int:
        print(f"\ncouldn't bind to server socket: hostname={options.host} port={options.port}\n",
              file=sys.stderr, flush=True)  # fmt: skip
        return EXIT_BIND_FAILED

    def listening() -> None:
        # printf of the port it was given (0 stays 0), left in stdout's buffer.
        print(f"\n{LISTENING} http://{options.host}:{options.port}\n")

    def first(signum: int) -> None:
        print(f"\nCaught signal {signum}, shutting down gracefully...")

    def second(signum: int) -> None:
        print("Received second interrupt, terminating immediately.", file=sys.stderr)
        hard_exit(1)

    # cpp-httplib's default_socket_options: SO_REUSEPORT alone. It decodes no body itself
    # (built without compression): the framing middleware answers an encoded one, so
    # aiohttp must not inflate or refuse it first.
    site = AppSite(
        httplib_runner(server.handle, keepalive_timeout=options.keepalive_timeout),
        options.host,
        options.port,
        bind_failed=bind_failed,
        listening=listening,
        reuse_address=False,
        reuse_port=True,
    )
    return await serve_until_signal(site.start, site.close, first=first, second=second)


def _unknown(word: str) -> int:
    # whisper_params_parse: the first unknown word, the usage, and exit(0).
    print(f"error: unknown argument: {word}", file=sys.stderr)
    print(f"\nusage: {PROCESS_NAME} [options] \n", file=sys.stderr)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Run a simulated whisper-server; the exit code."""
    args, gpu_host = begin(_parser(), PROCESS_NAME, argv, unknown=_unknown)
    out, err = stdio.install()
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
