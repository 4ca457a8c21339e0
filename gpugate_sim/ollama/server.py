"""The simulated Ollama server: routes, lifecycle and the in-process API for tests."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

from aiohttp import web

import gpugate_sim.ollama.api_inference as api_inference
import gpugate_sim.ollama.api_models as api_models
import gpugate_sim.ollama.openai_api as openai_api
import gpugate_sim.ollama.openai_audio as openai_audio
from gpugate_sim.device import SimulatedGpuHost
from gpugate_sim.ollama.catalog import Catalog
from gpugate_sim.ollama.duration import parse_keep_alive_setting
from gpugate_sim.ollama.engine import Engine
from gpugate_sim.ollama.hostcheck import GIN_METHOD_ORDER, HostGuard, listens_on_loopback
from gpugate_sim.ollama.options import parse_options
from gpugate_sim.ollama.record import recorded
from gpugate_sim.ollama.runnerref import ScheduleError
from gpugate_sim.ollama.scheduler import Scheduler
from gpugate_sim.ollama.services import SERVICES, Services
from gpugate_sim.ollama.sizing import vram_context
from gpugate_sim.ollama.state import SimState
from gpugate_sim.ollama.wire import json_response
from gpugate_sim.recordfile import RecordFile
from gpugate_sim.scenario import OllamaSpec

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
MAX_BODY = 64 * 1024 * 1024
SHUTDOWN_GRACE = 1.0


class PreloadError(RuntimeError):
    """A model named under `ollama.preload` could not be loaded."""


def split_listen(listen: str) -> tuple[str, int]:
    """Split HOST:PORT: "127.0.0.1:11435" -> ("127.0.0.1", 11435), "[::1]:0" -> ("::1", 0)."""
    host, sep, port = listen.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"ollama.listen: expected HOST:PORT, got {listen!r}")
    return host.strip("[]") or "127.0.0.1", int(port)


class SimOllama:
    """A simulated Ollama: the aiohttp app, its scheduler and its runner children.

    `state()` and `wait_until()` expose what /sim/state serves, for tests in the same
    process; `close()` kills every runner child and waits for it.
    """

    def __init__(
        self,
        spec: OllamaSpec,
        gpu: SimulatedGpuHost,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.spec = spec
        self.gpu = gpu
        state = gpu.read()
        vram = sum(state.device(i).total for i in spec.devices(len(state.devices)))
        self.catalog = Catalog(
            spec.models, gpu.directory / "ollama" / "blobs", clock(),
            default_ctx=vram_context(vram, spec.context_length),
            auto_ctx=spec.context_length == 0,
        )  # fmt: skip
        self.scheduler = Scheduler(spec, gpu, clock)
        self.engine = Engine(spec, self.scheduler)
        self.url: str | None = None
        self._guard = HostGuard(split_listen(spec.listen)[0], spec.origins)
        self._handlers: set[asyncio.Task[object]] = set()
        self._runner: web.AppRunner | None = None
        self._records: RecordFile | None = None
        """Where each loading route's reading goes (`ollama.record`), once started."""
        self.app = self._build_app()

    def _build_app(self) -> web.Application:
        app = web.Application(client_max_size=MAX_BODY, middlewares=[self._track])
        app[SERVICES] = Services(self.spec, self.catalog, self.scheduler, self.engine)
        self._guard.install(app)
        app.middlewares.append(_gin_errors)
        app.on_response_prepare.append(_go_headers)
        get, post = app.router.add_get, app.router.add_post
        get("/", api_models.root)
        get("/api/version", api_models.version)
        get("/api/tags", api_models.tags)
        get("/api/ps", api_models.ps, allow_head=False)
        post("/api/show", api_models.show)
        post("/api/pull", api_models.pull)
        loads: list[tuple[str, Handler]] = [
            ("/api/generate", api_inference.generate),
            ("/api/chat", api_inference.chat),
            ("/api/embed", api_inference.embed),
            ("/api/embeddings", api_inference.embeddings),
            ("/v1/chat/completions", openai_api.chat_completions),
            ("/v1/completions", openai_api.completions),
            ("/v1/embeddings", openai_api.embeddings),
            ("/v1/audio/transcriptions", openai_audio.transcriptions),
        ]
        for path, handler in loads:
            post(path, recorded(lambda: self._records, handler))
        get("/v1/models", openai_api.list_models, allow_head=False)
        get("/v1/models/{model}", openai_api.retrieve_model, allow_head=False)
        get("/sim/state", self._sim_state, allow_head=False)
        self.scheduler.faults.install(app)
        return app

    # -- lifecycle -----------------------------------------------------------------------

    async def start(self, host: str | None = None, port: int | None = None) -> str:
        """Listen (default: the spec's `listen`), preload, and return the base URL."""
        spec_host, spec_port = split_listen(self.spec.listen)
        host = spec_host if host is None else host
        port = spec_port if port is None else port
        state = self.gpu.read()
        for gpu in self.spec.devices(len(state.devices)):
            try:
                state.device(gpu)
            except KeyError:
                field = "ollama.gpu" if self.spec.gpus is None else "ollama.gpus"
                raise ValueError(
                    f"{field}: the simulated host in {self.gpu.directory} has no GPU {gpu}"
                ) from None
        self._guard.check_host = listens_on_loopback(host)
        if self.spec.record is not None and self._records is None:
            self._records = RecordFile(self.spec.record)
        self.scheduler.start()
        # Go's net/http never decodes a request's Content-Encoding: a gzip body reaches the
        # JSON decoder as it is and fails there (400).
        self._runner = web.AppRunner(
            self.app,
            handler_cancellation=True,
            shutdown_timeout=SHUTDOWN_GRACE,
            access_log=None,
            auto_decompress=False,
        )
        try:
            await self._runner.setup()
            site = web.TCPSite(self._runner, host, port)
            await site.start()
            bound = self._runner.addresses[0]
            shown = f"[{bound[0]}]" if ":" in bound[0] else bound[0]
            self.url = f"http://{shown}:{bound[1]}"
            await self.preload()
        except BaseException:
            await self.close()
            raise
        return self.url

    async def preload(self) -> None:
        """Load every model of `spec.preload` with its keep_alive and options."""
        for entry in self.spec.preload:
            model = self.catalog.find(entry.model)
            if model is None:
                raise PreloadError(f"preload: unknown model {entry.model!r}")
            options = parse_options(model, entry.options)
            keep_alive = parse_keep_alive_setting(entry.keep_alive)
            try:
                lease = await self.scheduler.acquire(model, options, keep_alive)
            except ScheduleError as exc:
                raise PreloadError(f"preload of {entry.model}: {exc.message}") from None
            self.scheduler.release(lease)

    async def close(self) -> None:
        """Stop serving, then kill every runner child and wait for it to exit."""
        for task in list(self._handlers):
            task.cancel()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        await self.scheduler.close()
        if self._records is not None:
            self._records.close()
            self._records = None

    async def __aenter__(self) -> SimOllama:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- observation ---------------------------------------------------------------------

    def state(self) -> SimState:
        """What /sim/state serves: runners, counters, queued requests."""
        return self.scheduler.snapshot()

    async def wait_until(
        self, predicate: Callable[[SimState], bool], timeout: float = 10.0
    ) -> SimState:
        """Wait (on state changes, not a clock) until `predicate(state)` holds."""
        return await self.scheduler.wait_until(predicate, timeout)

    async def _sim_state(self, request: web.Request) -> web.StreamResponse:
        return json_response(self.state().as_json())

    @web.middleware
    async def _track(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        counted = not request.path.startswith("/sim/")
        task = asyncio.current_task()
        if task is not None:
            self._handlers.add(task)
        if counted:
            self.scheduler.counters.requests_in_flight += 1
            self.scheduler.changed()
        try:
            return await handler(request)
        finally:
            if task is not None:
                self._handlers.discard(task)
            if counted:
                self.scheduler.counters.requests_in_flight -= 1
                self.scheduler.changed()


@web.middleware
async def _gin_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Unknown routes and methods answered in gin's words (serveError: text/plain).

    Ollama sets HandleMethodNotAllowed: a path that other methods serve answers 405 with
    `Allow` listing them, in the order their routes were registered; any other path 404.
    """
    try:
        return await handler(request)
    except web.HTTPMethodNotAllowed as exc:
        allowed = [m for m in GIN_METHOD_ORDER if m in exc.allowed_methods]
        headers = {"Content-Type": "text/plain", "Allow": ", ".join(allowed)}
        return web.Response(status=405, body=b"405 method not allowed", headers=headers)
    except web.HTTPNotFound:
        headers = {"Content-Type": "text/plain"}
        return web.Response(status=404, body=b"404 page not found", headers=headers)


async def _go_headers(request: web.Request, response: web.StreamResponse) -> None:
    """Go's net/http sends no Server header."""
    response.headers.popall("Server", None)
