"""Router mode: many models, each in a child llama-server (tools/server/server-models.cpp).

* The models are the `--models-dir` entries (common/preset.cpp `load_from_models_dir`): a
  top-level `X.gguf` is model `X`; a sub-directory `X/` with a `.gguf` in it is model `X`
  (its `-00001-of-` shard first); `mmproj`/draft companions are skipped.
* `POST /models/load {"model"}` starts the child and answers `{"success":true}` at once;
  the model is `loading` until the child says it is ready. `POST /models/unload` asks it
  to stop. When `--models-max` models already run, the least recently used idle one is
  unloaded first (`unload_lru`); if none is idle the load fails: `model limit reached,
  try again later` (500).
* A request naming a model is forwarded to its child (streamed both ways); an unloaded
  model is loaded first unless `--no-models-autoload` (or `?autoload=false`), and the
  request waits for it; a load that fails answers `model name=X failed to load` (500).
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from gpugate_sim.llamaserver import children, framing
from gpugate_sim.llamaserver.children import LOADED, LOADING, UNLOADED, Instance
from gpugate_sim.llamaserver.cli import Args
from gpugate_sim.llamaserver.framing import (
    INVALID_REQUEST,
    NOT_FOUND,
    InvalidArgument,
    ServerError,
    error_response,
    json_response,
    parse_json,
)
from gpugate_sim.llamaserver.results import BUILD_INFO
from gpugate_sim.llamaserver.single import log
from gpugate_sim.serving import AppSite, serve_until_signal

_ROUTER_ONLY = {
    "--models-dir", "--models-max", "--models-preset", "--models-autoload",
    "--no-models-autoload", "--host", "--port", "-m", "--model", "-a", "--alias",
}  # fmt: skip
_NO_VALUE = {"--models-autoload", "--no-models-autoload"}
_PROXIED_POST = (
    "/completion", "/completions", "/v1/completions", "/chat/completions",
    "/v1/chat/completions", "/infill", "/embedding", "/embeddings", "/v1/embeddings",
    "/tokenize", "/detokenize", "/props", "/apply-template", "/rerank", "/v1/rerank",
)  # fmt: skip
_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length", "host", "upgrade"}


def scan_models_dir(directory: str) -> dict[str, str]:
    """Model name → file path, as `load_from_models_dir` finds them."""
    found: dict[str, str] = {}
    root = Path(directory)
    if not root.is_dir():
        raise ValueError(f"error: '{directory}' does not exist or is not a directory")
    for entry in sorted(root.iterdir()):
        if entry.is_dir():
            files = sorted(f for f in entry.iterdir() if f.name.endswith(".gguf"))
            models = [f for f in files if "mmproj" not in f.name and "draft" not in f.name]
            shards = [f for f in models if "-00001-of-" in f.name]
            chosen = shards or models
            if chosen:
                found[entry.name] = str(chosen[-1] if not shards else shards[0])
        elif entry.name.endswith(".gguf") and "mmproj" not in entry.name:
            found[entry.name.replace(".gguf", "")] = str(entry)
    return found


def base_args(words: list[str]) -> list[str]:
    """The router's own options that its children inherit (not the router-only ones)."""
    out: list[str] = []
    i = 0
    while i < len(words):
        word = words[i]
        if word.startswith("--sim-"):
            i += 1 if "=" in word else 2
            continue
        if word in _ROUTER_ONLY:
            i += 1 if word in _NO_VALUE else 2
            continue
        out.append(word)
        i += 1
    return out


def sim_args(words: list[str]) -> list[str]:
    """The `--sim-*` options, passed on to every child."""
    out: list[str] = []
    i = 0
    while i < len(words):
        if words[i].startswith("--sim-"):
            out.extend(words[i : i + (1 if "=" in words[i] else 2)])
            i += 1 if "=" in words[i] else 2
        else:
            i += 1
    return out


class Router:
    """The router's models and routes."""

    def __init__(self, args: Args, words: list[str], state_dir: Path | None) -> None:
        self.args = args
        self.models = {name: Instance(name, path) for name, path in
                       scan_models_dir(args.models_dir or "").items()}  # fmt: skip
        self.base = base_args(words)
        self.sim = sim_args(words)
        if state_dir is not None and "--sim-state-dir" not in self.sim:
            self.sim += ["--sim-state-dir", str(state_dir)]
        self.changed = asyncio.Condition()
        self.session: aiohttp.ClientSession | None = None
        self.app = web.Application(
            client_max_size=1 << 30, middlewares=[framing.make_middleware(lambda: True)]
        )
        add = self.app.router
        for path in ("/health", "/v1/health"):
            add.add_get(path, self.health)
        for path in ("/models", "/v1/models"):
            add.add_get(path, self.listing)
        add.add_post("/models/load", self.load_route)
        add.add_post("/models/unload", self.unload_route)
        add.add_get("/props", self.props)
        for path in _PROXIED_POST:
            add.add_post(path, self.proxy_post)

    def notify(self) -> None:
        asyncio.get_running_loop().create_task(self._notify())

    async def _notify(self) -> None:
        async with self.changed:
            self.changed.notify_all()

    # -- loading and unloading ------------------------------------------------------------

    def running(self) -> list[Instance]:
        return [m for m in self.models.values() if m.running]

    async def load(self, instance: Instance) -> None:
        """`server_models::load`: make room (LRU), then spawn."""
        limit = self.args.models_max
        if limit > 0 and len(self.running()) >= limit:
            idle = [m for m in self.running() if m.status == LOADED and not m.req_count
                    and not m.stopping]  # fmt: skip
            if idle:
                victim = min(idle, key=lambda m: m.last_used)
                log(f"srv    unload_lru: models_max limit reached, removing LRU name={victim.name}")
                await children.stop(victim)
                await self.wait_for(victim, lambda m: m.status == UNLOADED)
        if instance.status != UNLOADED:
            return
        if limit > 0 and len(self.running()) >= limit:
            raise ServerError("model limit reached, try again later")
        await children.spawn(instance, self.base, self.sim, self.args.port, self.notify)
        self.notify()

    async def wait_for(self, instance: Instance, done: Any) -> None:
        async with self.changed:
            await self.changed.wait_for(lambda: done(instance))

    async def ensure_ready(self, instance: Instance) -> None:
        """`ensure_model_ready`: load if needed and wait; ServerError if it fails."""
        if instance.status == LOADED and not instance.stopping:
            return
        if instance.stopping:
            await self.wait_for(instance, lambda m: m.status == UNLOADED)
        # A queued request waits for a slot (server_lru_sched): an idle model is evicted
        # for it as soon as there is one, a busy or loading one is waited for.
        while instance.status == UNLOADED:
            try:
                await self.load(instance)
            except ServerError:
                async with self.changed:
                    await self.changed.wait()
        await self.wait_for(instance, lambda m: m.status != LOADING)
        if instance.failed:
            raise ServerError(f"model name={instance.name} failed to load")
        if instance.status != LOADED:
            raise InvalidArgument(f"model name={instance.name} is not running")

    async def stop_all(self) -> None:
        """`unload_all`: ask every child to stop and wait for them."""
        for instance in self.running():
            await children.stop(instance)
        async with self.changed:
            await self.changed.wait_for(lambda: not self.running())

    # -- routes -----------------------------------------------------------------------------

    async def health(self, request: web.Request) -> web.StreamResponse:
        return json_response({"status": "ok"})

    async def listing(self, request: web.Request) -> web.StreamResponse:
        now = int(time.time())
        data = []
        for m in self.models.values():
            status: dict[str, Any] = {"value": m.status, "args": children.args_of(m)}
            status["preset"] = f"[{m.name}]\nmodel = {m.path}\n\n"
            if m.failed:
                status.update(exit_code=m.exit_code, failed=True)
            info: dict[str, Any] = {
                "id": m.name, "aliases": [], "tags": [], "object": "model",
                "owned_by": "llamacpp", "created": now, "status": status,
                "architecture": {"input_modalities": ["text"], "output_modalities": ["text"]},
                "source": "models_dir", "can_remove": False,
            }  # fmt: skip
            if m.running:
                info.update({k: v for k, v in m.loaded_info.items() if k not in info})
            data.append(info)
        return json_response({"data": data, "object": "list"})

    def _find(self, name: str) -> Instance | None:
        return self.models.get(name)

    async def load_route(self, request: web.Request) -> web.StreamResponse:
        body = parse_json(await request.read())
        instance = self._find(str(body.get("model", "")) if isinstance(body, dict) else "")
        if instance is None:
            return error_response("model is not found", NOT_FOUND)
        if instance.running:
            return error_response("model is already running", INVALID_REQUEST)
        await self.load(instance)
        return json_response({"success": True})

    async def unload_route(self, request: web.Request) -> web.StreamResponse:
        body = parse_json(await request.read())
        instance = self._find(str(body.get("model", "")) if isinstance(body, dict) else "")
        if instance is None:
            return error_response("model is not found", INVALID_REQUEST)
        if not instance.running:
            return error_response("model is not running", INVALID_REQUEST)
        await children.stop(instance)
        return json_response({"success": True})

    async def props(self, request: web.Request) -> web.StreamResponse:
        if not request.query.get("model"):
            return json_response({
                "role": "router", "max_instances": self.args.models_max,
                "models_autoload": self.args.models_autoload, "model_alias": "llama-server",
                "model_path": "none",
                "default_generation_settings": {"params": None, "n_ctx": 0},
                "ui_settings": {}, "build_info": BUILD_INFO, "cors_proxy_enabled": False,
            })  # fmt: skip
        return await self._route(request, request.query["model"], b"", touch=False)

    async def proxy_post(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        body = parse_json(raw)
        name = body.get("model", "") if isinstance(body, dict) else ""
        return await self._route(request, name if isinstance(name, str) else "", raw, touch=True)

    async def _route(
        self, request: web.Request, name: str, raw: bytes, *, touch: bool
    ) -> web.StreamResponse:
        if not name:
            return error_response("model name is missing from the request", INVALID_REQUEST)
        instance = self._find(name)
        if instance is None:
            return error_response(f"model '{name}' not found", INVALID_REQUEST)
        autoload = request.query.get("autoload", "")
        auto = self.args.models_autoload if not autoload else autoload in ("true", "1")
        if not auto and not instance.running:
            return error_response("model is not loaded", INVALID_REQUEST)
        if auto:
            await self.ensure_ready(instance)
        if not instance.running:
            raise InvalidArgument(f"model name={name} is not running")
        if touch:
            instance.last_used = time.monotonic()
        instance.req_count += 1
        try:
            return await self._forward(request, instance, raw)
        finally:
            instance.req_count = max(0, instance.req_count - 1)

    async def _forward(
        self, request: web.Request, instance: Instance, raw: bytes
    ) -> web.StreamResponse:
        assert self.session is not None
        url = f"http://127.0.0.1:{instance.port}{request.path_qs}"
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP}
        async with self.session.request(request.method, url, data=raw or None,
                                        headers=headers) as upstream:  # fmt: skip
            response = web.StreamResponse(status=upstream.status)
            for key, value in upstream.headers.items():
                if key.lower() not in _HOP and key.lower() != "date":
                    response.headers[key] = value
            await response.prepare(request)
            async for chunk in upstream.content.iter_any():
                await response.write(chunk)
            await framing.end_chunked(request, response)
            return response


async def run_router(args: Args, state_dir: Path | None, words: list[str]) -> int:
    """Serve as a router until SIGTERM/SIGINT, then stop every child; the exit code."""
    try:
        router = Router(args, words, state_dir)
    except ValueError as exc:
        log(f"srv    llama_server: failed to initialize router models: {exc}")
        return 1
    log(f"srv    load_models: Available models ({len(router.models)}):")
    for name in router.models:
        log(f"srv    load_models:   [models_dir] {name}")

    def second(signum: int) -> None:
        log("Received second interrupt, terminating immediately.")
        os._exit(1)

    def bind_failed(exc: OSError) -> int:
        log(f"srv          start: couldn't bind HTTP server socket, hostname: {args.host}, "
            f"port: {args.port}")  # fmt: skip
        return 1

    site = AppSite(router.app, args.host, args.port, bind_failed=bind_failed)

    async def start() -> int | None:
        # A connection per proxied request, as server_http_proxy's own ClientImpl
        # (server-models.cpp): a child ends one after every stream anyway.
        router.session = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=None),
            auto_decompress=False,
            connector=aiohttp.TCPConnector(force_close=True),
        )
        code = await site.start()
        if code is not None:
            await router.session.close()
            return code
        log("srv    llama_server: starting server in router mode. models will be automatically "
            "loaded on-demand")  # fmt: skip
        log(f"srv    llama_server: listening on http://{args.host}:{args.port}")
        return None

    async def close() -> None:
        log("srv    operator(): cleaning up before exit...")
        await site.close()
        await router.stop_all()
        assert router.session is not None
        await router.session.close()

    return await serve_until_signal(start, close, second=second)
