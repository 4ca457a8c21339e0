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
import sys
import threading
import time
from pathlib import Path
from typing import Any

from aiohttp import web

from gpugate_sim.device import SimulatedGpuHost
from gpugate_sim.llamaserver.cli import Args
from gpugate_sim.llamaserver.framing import dumps
from gpugate_sim.llamaserver.memory import (
    CUDA_CONTEXT,
    GpuHolding,
    LoadFailed,
    PlacementOptions,
    place,
)
from gpugate_sim.llamaserver.model import (
    NotAModel,
    load_model_info,
    pooling_from_option,
    sized_for,
    with_weights,
)
from gpugate_sim.llamaserver.record import LoadRecord, Records
from gpugate_sim.llamaserver.server import ModelServer, ServeOptions
from gpugate_sim.serving import AppSite, serve_until_signal

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
    stop = asyncio.Event()
    site: AppSite | None = None

    def second(signum: int) -> None:
        log("Received second interrupt, terminating immediately.")
        holding.release()
        os._exit(EXIT_FAILED)

    def bind_failed(exc: OSError) -> int:
        log(f"srv          start: couldn't bind HTTP server socket, hostname: {args.host}, "
            f"port: {args.port}")  # fmt: skip
        log("srv    llama_server: exiting due to HTTP server error")
        return EXIT_FAILED

    async def start() -> int | None:
        nonlocal site
        if is_child:
            loop = asyncio.get_running_loop()
            threading.Thread(target=_watch_stdin, args=(loop, stop), daemon=True).start()
        server, failure = _model_server(args, holding, on_gpu=gpu_host is not None)
        app = server.app if server is not None else web.Application(middlewares=[])
        site = AppSite(app, args.host, args.port, bind_failed=bind_failed)
        code = await site.start()
        if code is not None:
            return code
        log(f"main: loading model '{args.model}'")
        try:
            if server is None:
                raise LoadFailed([failure])
            await _load(server, holding, args.sim_load_seconds, is_child)
        except LoadFailed as exc:
            holding.release()
            for line in exc.lines:
                log(line)
            log("srv    llama_server: exiting due to model loading error")
            _record(records, args, None, False)
            await site.close()
            return EXIT_FAILED
        server.ready = True
        _record(records, args, server, True)
        log("srv    llama_server: model loaded")
        host, port = site.bound()
        log(f"srv    llama_server: listening on http://{host}:{port}")
        if is_child:
            notify_router("ready", server.model_info())
        return None

    async def close() -> None:
        log("srv    operator(): cleaning up before exit...")
        assert site is not None, "closed only once it served"
        await site.close()
        holding.release()
        if records is not None:
            records.close()

    return await serve_until_signal(start, close, stop=stop, second=second)


def _model_server(
    args: Args, holding: GpuHolding, *, on_gpu: bool
) -> tuple[ModelServer | None, str]:
    """The model's server, placed in the free memory; None and why when the model file
    cannot be read."""
    assert args.model is not None
    try:
        info = load_model_info(args.model)
        size = sized_for(args.sim_model_sizes, args.model)
        if size is not None:
            info = with_weights(info, size)
    except (OSError, NotAModel) as exc:
        return None, f"llama_model_load: error loading model: {exc}"
    options = ServeOptions(
        aliases=args.alias,
        n_parallel=4 if args.parallel < 0 else args.parallel,
        embeddings=args.embeddings,
        pooling=pooling_from_option(args.pooling),
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
        n_ubatch=min(args.ubatch, args.batch), on_gpu=on_gpu,
        streams=streams, slots=options.n_parallel, flash_attn=args.flash_attn != "off",
    )  # fmt: skip
    if on_gpu:
        # ggml's CUDA backend starts before the model loads: what --fit then sees free
        # is without the process's own context.
        try:
            holding.take(CUDA_CONTEXT, "CUDA context")
        except LoadFailed as exc:
            return None, exc.lines[-1]
    return ModelServer(info, place(info, placement, holding.free_bytes()), options), ""


async def _load(
    server: ModelServer, holding: GpuHolding, load_seconds: float, is_child: bool
) -> None:
    """Take the model's memory: the weights, then (after the load time) the KV cache and the
    compute buffer; LoadFailed when one does not fit."""
    if is_child:
        notify_router("loading", {"stages": ["text_model"], "current": "text_model",
                                  "value": 0.0})  # fmt: skip
    plan = server.plan
    holding.take(plan.weights, "model weights")
    if load_seconds:
        await asyncio.sleep(load_seconds)
    holding.take(plan.kv, "KV cache")
    holding.take(plan.compute, "compute buffer")


def _record(records: Records | None, args: Args, server: ModelServer | None, ok: bool) -> None:
    if records is None:
        return
    plan = server.plan if server is not None else None
    records.write(LoadRecord(
        t=time.time(), pid=os.getpid(), model=str(args.model), loaded=ok,
        n_ctx=plan.n_ctx if plan else 0, gpu_layers=plan.gpu_layers if plan else 0,
        bytes=plan.total + CUDA_CONTEXT if plan and args.gpu is not None else 0,
    ))  # fmt: skip
