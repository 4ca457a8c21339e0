"""A gate over a fake card and a fake clock, with its real control app on a free port:
what operators do to it (pause, drain) and what it shows for that."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import attrs
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client.parser import text_string_to_metric_families

from gpugate.control.app import control_app
from gpugate.control.metrics import GateMetrics
from gpugate.core.observation import HostObservation
from gpugate.gate.gate import Gate
from gpugate.gpu.sampler import Sampler
from gpugate.runtimes.sections import load_config_text
from tests.gate.fakes import FakeAttributor, FakeGpu

TOKEN = "ops-secret-token"
STALE_AFTER = 3600.0
CONFIG = f"""\
gate:
  control: 127.0.0.1:1
  control_tokens: ["{TOKEN}"]
budget:
  reserve: 1GiB
  sample_interval: 10m
  stale_after: {STALE_AFTER:.0f}s
consumers:
  trainer:
    runtime: http
    listen: 127.0.0.1:11
    upstream: http://127.0.0.1:21
    processes: {{commands: [trainer]}}
  render:
    runtime: http
    listen: 127.0.0.1:12
    upstream: http://127.0.0.1:22
    processes: {{commands: [render]}}
"""


@attrs.define
class Clock:
    """The gate's and its sampler's clock: time moves only when a test moves it (and the
    sampler, every 10m of real time, takes no sample during a test)."""

    now: float = 1000.0

    def __call__(self) -> float:
        return self.now


@attrs.define
class Operated:
    gate: Gate
    clock: Clock
    client: TestClient

    async def post(self, path: str, body: dict | None = None) -> tuple[int, dict]:
        async with self.client.post(path, json=body, headers=auth()) as resp:
            return resp.status, await resp.json()

    async def get(self, path: str) -> Any:
        async with self.client.get(path) as resp:
            assert resp.status in (200, 503), await resp.text()
            return await resp.json()

    async def metrics(self) -> dict[tuple[str, tuple], float]:
        """Every sample of /metrics by (name, sorted labels)."""
        async with self.client.get("/metrics") as resp:
            text = await resp.text()
        return {
            (s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text)
            for s in family.samples
        }

    async def exposition(self) -> str:
        async with self.client.get("/metrics") as resp:
            return await resp.text()


def auth() -> dict[str, str]:
    return {"Authorization": f"Bearer {TOKEN}"}


@contextlib.asynccontextmanager
async def operated_gate(tmp_path: Path, *, before: Any = None) -> AsyncIterator[Operated]:
    """The gate started, its control app serving; `before(gate)` runs before the control
    app (and the metrics) are made."""
    config = load_config_text(CONFIG, tmp_path / "consumers.yaml")
    clock = Clock()
    sampler = Sampler(FakeGpu(), FakeAttributor(), clock=clock)
    # The start takes one sample and the sampling loop one more at once: wait for that
    # one, so that no sample lands after a test has moved the clock.
    looped = asyncio.Event()
    taken = 0
    sample = sampler.sample

    async def counted() -> HostObservation:
        nonlocal taken
        observation = await sample()
        taken += 1
        if taken == 2:
            looped.set()
        return observation

    sampler.sample = counted  # type: ignore[method-assign]
    gate = Gate(config, sampler, clock=clock)
    await gate.start()
    try:
        await asyncio.wait_for(looped.wait(), 10)
        if before is not None:
            before(gate)
        app = control_app(gate, GateMetrics(gate))
        async with TestClient(TestServer(app)) as client:
            yield Operated(gate, clock, client)
    finally:
        await gate.close()
