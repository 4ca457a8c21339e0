"""A gate over fakes it does not know are fakes: an NVML reader, an attributor, and an
upstream whose answers (or silences) each test chooses.

The gate runs with its real sampler, core, unloads and loops; only what it talks to is
scripted, so a hung listing, a non-JSON body or an unload whose memory never comes back
can be made to happen on demand.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
from collections.abc import AsyncIterator, Callable, Collection, Mapping
from pathlib import Path

import attrs
from aiohttp import web

from gpugate.core.observation import OTHER, Owner, OwnerKind
from gpugate.core.units import GiB, MiB
from gpugate.gate.gate import Gate
from gpugate.gpu.attribution import Attribution, MatchKind
from gpugate.gpu.nvml import ContextKind, DeviceSample, HostSample, MemoryApi, ProcessSample
from gpugate.gpu.sampler import Sampler
from gpugate.runtimes.sections import load_config_text

TOTAL = 16 * GiB
RESERVED = 434 * MiB


class Mode(enum.Enum):
    OK = "ok"
    HANG = "hang"
    GARBAGE = "garbage"
    """200 with a body that is not JSON."""
    SHAPE = "shape"
    """200 with `shape_body`: JSON, but not what was asked for."""


@attrs.define
class FakeGpu:
    """One 16 GiB card; `held` maps PIDs to bytes. PIDs below 1000 belong to `ollama`."""

    held: dict[int, int] = attrs.field(factory=dict)
    fail: Exception | None = None

    def read(self) -> HostSample:
        if self.fail is not None:
            raise self.fail
        used = sum(self.held.values())
        processes = tuple(
            ProcessSample(pid, nbytes, ContextKind.COMPUTE) for pid, nbytes in self.held.items()
        )
        device = DeviceSample(
            0, "GPU-0", "fake", TOTAL, RESERVED, used, TOTAL - RESERVED - used,
            MemoryApi.V2, processes,
        )  # fmt: skip
        return HostSample("555.0", (device,))

    def close(self) -> None:
        pass


class FakeAttributor:
    def attribute(self, pids: Collection[int]) -> Mapping[int, Attribution]:
        return {pid: _owner(pid) for pid in pids}


def _owner(pid: int) -> Attribution:
    if pid < 1000:
        return Attribution(pid, Owner(OwnerKind.CONSUMER, "ollama"), MatchKind.COMMAND)
    return Attribution(pid, Owner(OwnerKind.EXTERNAL, OTHER), MatchKind.NONE)


@attrs.define
class FakeUpstream:
    """An Ollama-shaped upstream: /api/ps lists `loaded`; unloads call `on_unload`."""

    loaded: dict[str, int] = attrs.field(factory=dict)
    ps: Mode = Mode.OK
    unload_mode: Mode = Mode.OK
    tags_mode: Mode = Mode.OK
    show_mode: Mode = Mode.OK
    """/api/show: OK answers 404 (no model is installed), as Ollama does for one it lacks."""
    shape_body: object = attrs.field(factory=lambda: {"models": {"name": 3}})
    on_unload: Callable[[str], None] = lambda model: None
    ps_calls: int = 0
    released: asyncio.Event = attrs.field(factory=asyncio.Event)
    """Set to let every hung handler go (so the server can stop)."""

    async def _answer(self, mode: Mode, body: object) -> web.Response:
        if mode is Mode.HANG:
            await self.released.wait()
        if mode is Mode.GARBAGE:
            return web.Response(text="<html>502 Bad Gateway</html>", content_type="text/html")
        if mode is Mode.SHAPE:
            return web.json_response(self.shape_body)
        return web.json_response(body)

    async def handle_ps(self, request: web.Request) -> web.Response:
        self.ps_calls += 1
        models = [
            {"name": m, "model": m, "size": n, "size_vram": n, "expires_at": None}
            for m, n in self.loaded.items()
        ]
        return await self._answer(self.ps, {"models": models})

    async def handle_generate(self, request: web.Request) -> web.Response:
        body = await request.json()
        if self.unload_mode is Mode.OK and body.get("keep_alive") == 0:
            self.loaded.pop(body["model"], None)
            self.on_unload(body["model"])
        return await self._answer(self.unload_mode, {"model": body["model"], "done": True})

    async def handle_tags(self, request: web.Request) -> web.Response:
        return await self._answer(self.tags_mode, {"models": []})

    async def handle_show(self, request: web.Request) -> web.Response:
        if self.show_mode is Mode.OK:
            return web.json_response({"error": "model not found"}, status=404)
        return await self._answer(self.show_mode, {})

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/api/show", self.handle_show)
        app.router.add_get("/api/ps", self.handle_ps)
        app.router.add_post("/api/generate", self.handle_generate)
        app.router.add_get("/api/tags", self.handle_tags)
        return app


def gate_config(upstream_url: str, tmp_path: Path, extra_consumer: str = "") -> str:
    return f"""\
gate:
  control: 127.0.0.1:1
budget:
  reserve: 1GiB
  reserve_max: 1GiB
  sample_interval: 50ms
  stale_after: 1s
  reclaim_timeout: 500ms
consumers:
  ollama:
    runtime: ollama
    listen: 127.0.0.1:2
    processes: {{commands: [llama-server]}}
    upstream: {upstream_url}
    class: interactive
    residency: {{policy: keep_warm, ttl: 15m}}
    timeouts: {{control: 200ms, connect: 200ms}}
{extra_consumer}    models:
      gemma3:12b: {{envelope: 7796MiB}}
      bge-m3: {{class: background, envelope: 2012MiB}}
      llama3.2:3b: {{class: benchmark, envelope: 3200MiB}}
      qwen2.5:7b: {{envelope: 5700MiB}}
"""


@attrs.define
class Fakes:
    gate: Gate
    gpu: FakeGpu
    upstream: FakeUpstream
    url: str


@contextlib.asynccontextmanager
async def fake_gate(
    tmp_path: Path,
    *,
    upstream: FakeUpstream | None = None,
    gpu: FakeGpu | None = None,
    listing_interval: float = 0.05,
    clock: Callable[[], float] | None = None,
    extra_consumer: str = "",
) -> AsyncIterator[Fakes]:
    """A started gate over a fake card and a fake upstream."""
    upstream = upstream or FakeUpstream()
    gpu = gpu or FakeGpu()
    runner = web.AppRunner(upstream.app())
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    url = f"http://127.0.0.1:{port}"
    config = load_config_text(
        gate_config(url, tmp_path, extra_consumer), tmp_path / "consumers.yaml"
    )
    kwargs = {} if clock is None else {"clock": clock}
    gate = Gate(
        config,
        Sampler(gpu, FakeAttributor()),
        listing_interval=listing_interval,
        **kwargs,
    )
    await gate.start()
    try:
        yield Fakes(gate, gpu, upstream, url)
    finally:
        upstream.released.set()
        await gate.close()
        await runner.cleanup()
