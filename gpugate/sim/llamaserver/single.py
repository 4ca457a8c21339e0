"""Single-model mode: bind, load, serve, free (tools/server/server.cpp `llama_server`).

The HTTP server starts **before** the model loads, so `/health` answers 503 `Loading
model` meanwhile; a model that cannot be loaded (no such file, not GGUF, out of memory)
ends the process with status 1 after `exiting due to model loading error`. The weights
are allocated first, the KV cache and compute buffer after the load time.

Spawned by a router (`LLAMA_SERVER_ROUTER_PORT` set, server-models.cpp `server_child`) the
process also reports its state on stdout as `cmd_child_to_router:state:{json}` lines,
reads its stdin for `cmd_router_to_child:exit` (a graceful stop) and exits with status 1
as soon as stdin reaches EOF: the router is gone.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

from aiohttp import web

from gpugate.sim.device import SimulatedGpuHost
from gpugate.sim.llamaserver.cli import Args
from gpugate.sim.llamaserver.framing import dumps
from gpugate.sim.llamaserver.memory import (
    CUDA_CONTEXT,
    GpuHolding,
    LoadFailed,
    PlacementOptions,
    place,
)
from gpugate.sim.llamaserver.model import (
    NotAModel,
    load_model_info,
    pooling_from_option,
    sized_for,
    with_weights,
)
from gpugate.sim.llamaserver.record import LoadRecord, Records
from gpugate.sim.llamaserver.server import ModelServer, ServeOptions

ROUTER_PORT_ENV = "LLAMA_SERVER_ROUTER_PORT"
CHILD_STATE = "cmd_child_to_router:state:"
CHILD_EXIT = "cmd_router_to_child:exit"
EXIT_FAILED = 1


def log(line: str) -> None:
    """A log line on stderr, as common_log writes it."""
    with contextlib.suppress(OSError, ValueError):
        sys.stderr.write(line + "\n")
        sys.stderr.flush()


def notify_router(state: str, payload: Any) -> None:
    """`server_child::notify_to_router`: a leading newline closes any open log line."""
    data = dumps({"state": state, "payload": payload})
    with contextlib.suppress(OSError, ValueError):
        sys.stdout.write(f"\n{CHILD_STATE}{data}\n")
        sys.stdout.flush()


def _watch_stdin(loop: asyncio.AbstractEventLoop, stop: asyncio.Event) -> None:
    """`server_child::setup`: the exit command stops gracefully; EOF ends the process."""
    for line in sys.stdin:
        if CHILD_EXIT in line:
            log("srv    operator(): exit command received, exiting...")
            loop.call_soon_threadsafe(stop.set)
            return
    log("srv    operator(): EOF on stdin detected, forcing shutdown...")
    os._exit(EXIT_FAILED)


def run_single(args: Args, state_dir: Path | None) -> int:
    """Serve one model until stopped; the exit code."""
    return asyncio.run(_serve(args, state_dir))


async def _serve(args: Args, state_dir: Path | None) -> int:
    assert args.model is not None
    is_child = ROUTER_PORT_ENV in os.environ
    records = Records(args.sim_record) if args.sim_record is not None else None
    gpu = args.gpu
    gpu_host = SimulatedGpuHost(state_dir) if state_dir is not None and gpu is not None else None
    holding = GpuHolding(gpu_host, gpu or 0, ordinal=args.ordinal or 0)
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()

    def on_signal(signum: int) -> None:
        if stop.is_set():
            log("Received second interrupt, terminating immediately.")
            holding.release()
            os._exit(EXIT_FAILED)
        stop.set()

    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, on_signal, signum)
    if is_child:
        threading.Thread(target=_watch_stdin, args=(loop, stop), daemon=True).start()
    try:
        info = load_model_info(args.model)
        size = sized_for(args.sim_model_sizes, args.model)
        if size is not None:
            info = with_weights(info, size)
    except (OSError, NotAModel) as exc:
        info = None
        failure = f"llama_model_load: error loading model: {exc}"
    pooling = pooling_from_option(args.pooling)
    options = ServeOptions(
        aliases=args.alias,
        n_parallel=4 if args.parallel < 0 else args.parallel,
        embeddings=args.embeddings,
        pooling=pooling,
        n_predict=args.n_predict,
        tokens_per_second=args.sim_tokens_per_second,
        prompt_tokens_per_second=args.sim_prompt_tokens_per_second,
        eos_after=args.sim_eos_after,
    )
    # Slots the server picks itself share one KV stream (kv_unified); set ones get one each.
    streams = 1 if args.parallel < 0 else args.parallel
    placement = PlacementOptions(
        ctx_size=args.ctx_size, n_gpu_layers=args.n_gpu_layers, fit=args.fit,
        fit_target=args.fit_target, fit_min_ctx=args.fit_ctx,
        n_ubatch=min(args.ubatch, args.batch), on_gpu=gpu_host is not None,
        streams=streams, slots=options.n_parallel, flash_attn=args.flash_attn != "off",
    )  # fmt: skip
    app = web.Application(middlewares=[])
    server: ModelServer | None = None
    if info is not None and gpu_host is not None:
        # ggml's CUDA backend starts before the model loads: what --fit then sees free
        # is without the process's own context.
        try:
            holding.take(CUDA_CONTEXT, "CUDA context")
        except LoadFailed as exc:
            info, failure = None, exc.lines[-1]
    if info is not None:
        plan = place(info, placement, holding.free_bytes())
        server = ModelServer(info, plan, options)
        app = server.app
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, args.host, args.port, reuse_address=True)
    try:
        await site.start()
    except OSError:
        log(f"srv          start: couldn't bind HTTP server socket, hostname: {args.host}, "
            f"port: {args.port}")  # fmt: skip
        log("srv    llama_server: exiting due to HTTP server error")
        await runner.cleanup()
        return EXIT_FAILED
    log(f"main: loading model '{args.model}'")
    try:
        if server is None:
            raise LoadFailed([failure])
        if is_child:
            notify_router("loading", {"stages": ["text_model"], "current": "text_model",
                                      "value": 0.0})  # fmt: skip
        plan = server.plan
        holding.take(plan.weights, "model weights")
        if args.sim_load_seconds:
            await asyncio.sleep(args.sim_load_seconds)
        holding.take(plan.kv, "KV cache")
        holding.take(plan.compute, "compute buffer")
    except LoadFailed as exc:
        holding.release()
        for line in exc.lines:
            log(line)
        log("srv    llama_server: exiting due to model loading error")
        _record(records, args, None, False)
        await runner.cleanup()
        return EXIT_FAILED
    server.ready = True
    _record(records, args, server, True)
    log("srv    llama_server: model loaded")
    for sock in site._server.sockets if site._server else []:  # type: ignore[attr-defined]
        host, port = sock.getsockname()[:2]
        log(f"srv    llama_server: listening on http://{host}:{port}")
        break
    if is_child:
        notify_router("ready", server.model_info())
    try:
        await stop.wait()
    finally:
        log("srv    operator(): cleaning up before exit...")
        await runner.cleanup()
        holding.release()
        if records is not None:
            records.close()
    return 0


def _record(records: Records | None, args: Args, server: ModelServer | None, ok: bool) -> None:
    if records is None:
        return
    plan = server.plan if server is not None else None
    records.write(LoadRecord(
        t=time.time(), pid=os.getpid(), model=str(args.model), loaded=ok,
        n_ctx=plan.n_ctx if plan else 0, gpu_layers=plan.gpu_layers if plan else 0,
        bytes=plan.total + CUDA_CONTEXT if plan and args.gpu is not None else 0,
    ))  # fmt: skip
