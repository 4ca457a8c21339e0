"""Each consumer's health comes from the signal its runtime has: a listing, a health route,
a process, or nothing; /gate/v1/health says which, how old, and whether it is fresh."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import attrs
import pytest
from aiohttp.test_utils import TestClient, TestServer

from gpugate.config.model import Consumer
from gpugate.control.app import control_app, health_document
from gpugate.control.metrics import GateMetrics
from gpugate.gate.gate import Gate
from gpugate.gpu.sampler import Sampler
from gpugate.runtimes.base import (
    Health,
    HealthSignal,
    Inventory,
    LoadedModel,
    Memory,
    ModelSettings,
    NotSupported,
    Residents,
    Runtime,
)
from gpugate.runtimes.controlled import ProcessLifecycle, ProcessModel
from gpugate.runtimes.http import PassReading
from gpugate.runtimes.process import Exit, ProcessControl
from gpugate.runtimes.sections import load_config_text
from tests.gate.fakes import FakeAttributor, FakeGpu

INTERVAL = 10.0
"""The listing interval: the loops ask once at the start, then not again during a test."""
CONTROL = 1.0
BOUND = 3 * INTERVAL + CONTROL
START_TIMEOUT = 20.0

CONFIG = """\
gate:
  control: 127.0.0.1:1
budget:
  reserve: 1GiB
  sample_interval: 50ms
  stale_after: 1h
consumers:
{consumers}"""
CONSUMER = """\
  {name}:
    runtime: http
    listen: 127.0.0.1:{port}
    processes: {{commands: [{name}-server]}}
    upstream: http://127.0.0.1:{upstream}
    timeouts: {{control: 1s}}
"""
CONTROLLED = "    envelope: 1GiB\n    control: {command: [proc-server], start_timeout: 20s}\n"


class FakeProcess(ProcessControl):
    def __init__(self) -> None:
        self.running = True

    async def start(self) -> None:
        self.running = True

    async def stop(self) -> Exit | None:
        self.running = False
        return None

    async def is_running(self) -> bool:
        return self.running


@attrs.define
class Answers:
    """What a fake runtime answers, and a wake-up for each time it was asked."""

    healthy: bool = True
    asked: int = 0
    called: asyncio.Event = attrs.field(factory=asyncio.Event)

    def ask(self) -> bool:
        self.asked += 1
        self.called.set()
        return self.healthy


class FakeHealth(Health):
    def __init__(self, signal: HealthSignal) -> None:
        self.signal = signal
        self.answers = Answers()

    async def check(self, session: aiohttp.ClientSession) -> bool:
        return self.answers.ask()


class FakeInventory(Inventory):
    def __init__(self, answers: Answers) -> None:
        self.answers = answers

    async def listing(self, session: aiohttp.ClientSession) -> list[LoadedModel]:
        self.answers.ask()
        return []


class NoUnload(Residents):
    async def evict(self, session: aiohttp.ClientSession, model: str) -> None:
        raise NotSupported("no unload")

    def evict_timeout(self) -> float:
        return CONTROL


SIGNALS = {
    "listed": HealthSignal.LISTING,
    "routed": HealthSignal.HEALTH_ROUTE,
    "proc": HealthSignal.PROCESS,
    "quiet": HealthSignal.UNOBSERVED,
}


def fake_runtime(consumer: Consumer) -> Runtime:
    """A runtime whose health signal is its name's: a listing, a health route, a process
    (a control the test stops by hand), or nothing."""
    health = FakeHealth(SIGNALS[consumer.name])
    listed = consumer.name == "listed"
    process = consumer.name == "proc"
    settings = ModelSettings(consumer)
    return Runtime(
        settings=settings,
        reading=PassReading(),
        residents=NoUnload(),
        health=health,
        memory=Memory(settings),
        inventory=FakeInventory(health.answers) if listed else None,
        lifecycle=ProcessLifecycle(ProcessModel(consumer), FakeProcess()) if process else None,
    )


@attrs.define
class Clock:
    now: float = 1000.0

    def __call__(self) -> float:
        return self.now


@contextlib.asynccontextmanager
async def gate_of(tmp_path: Path, clock: Clock) -> AsyncIterator[Gate]:
    consumers = "".join(
        CONSUMER.format(name=name, port=10 + n, upstream=20 + n)
        + (CONTROLLED if name == "proc" else "")
        for n, name in enumerate(SIGNALS)
    )
    config = load_config_text(CONFIG.format(consumers=consumers), tmp_path / "consumers.yaml")
    gate = Gate(
        config,
        Sampler(FakeGpu(), FakeAttributor()),
        clock=clock,
        listing_interval=INTERVAL,
        runtimes=fake_runtime,
    )
    await gate.start()
    try:
        # Each loop's first question, asked at the start, has been answered.
        for name in ("listed", "routed", "proc"):
            await asyncio.wait_for(answers(gate, name).called.wait(), 5)
        yield gate
    finally:
        await gate.close()


def answers(gate: Gate, name: str) -> Answers:
    health = gate.links[name].runtime.health
    assert isinstance(health, FakeHealth)
    return health.answers


def consumer_checks(document: dict) -> dict[str, dict]:
    return {c["consumer"]: c for c in document["checks"] if "consumer" in c}


async def test_each_consumer_is_judged_by_its_own_signal_and_none_without_one(tmp_path):
    clock = Clock()
    async with gate_of(tmp_path, clock) as gate:
        document = health_document(gate)
        assert document["ok"] is True, document
        checks = consumer_checks(document)
        assert {name: c["signal"] for name, c in checks.items()} == {
            "listed": "listing",
            "routed": "health_route",
            "proc": "process",
            "quiet": "unobserved",
        }
        assert {name: c["check"] for name, c in checks.items()} == {
            name: c["signal"] for name, c in checks.items()
        }
        assert checks["quiet"] == {
            "check": "unobserved",
            "consumer": "quiet",
            "signal": "unobserved",
            "ok": True,
            "fresh": None,
            "age_seconds": None,
            "limit_seconds": None,
        }
        assert checks["listed"]["limit_seconds"] == pytest.approx(BOUND)
        assert checks["routed"]["limit_seconds"] == pytest.approx(BOUND)
        # A process's health route is silent while it starts.
        assert checks["proc"]["limit_seconds"] == pytest.approx(BOUND + START_TIMEOUT)
        assert checks["proc"]["stopped"] is False
        assert all(c["fresh"] for name, c in checks.items() if name != "quiet")


async def test_fresh_answers_keep_the_gate_healthy_long_after_its_start(tmp_path):
    """The gate once turned 503 16 s after every start: only listed consumers were asked."""
    clock = Clock()
    async with gate_of(tmp_path, clock) as gate:
        clock.now += BOUND + START_TIMEOUT + 60
        stale = health_document(gate)
        assert stale["failed"] == ["listing", "health_route", "process"]
        assert consumer_checks(stale)["quiet"]["ok"] is True

        await gate.signals.reconcile(gate.links["listed"])
        for name in ("routed", "proc"):
            await gate.signals.probe(gate.links[name])
        document = health_document(gate)
        assert document["ok"] is True, document
        assert {c["age_seconds"] for c in consumer_checks(document).values()} == {0.0, None}


async def test_a_route_that_answers_unwell_goes_stale_and_health_says_which(tmp_path):
    clock = Clock()
    async with gate_of(tmp_path, clock) as gate:
        routed = answers(gate, "routed")
        routed.healthy = False
        clock.now += BOUND + 1
        with pytest.raises(Exception, match="unwell"):
            await gate.signals.probe(gate.links["routed"])
        await gate.signals.reconcile(gate.links["listed"])
        await gate.signals.probe(gate.links["proc"])
        async with (
            TestClient(TestServer(control_app(gate, GateMetrics(gate)))) as client,
            client.get("/gate/v1/health") as resp,
        ):
            assert resp.status == 503
            body = await resp.json()
        assert body["failed"] == ["health_route"]
        check = consumer_checks(body)["routed"]
        assert check["ok"] is False and check["fresh"] is False
        assert check["age_seconds"] == pytest.approx(BOUND + 1)
        assert check["age_seconds"] > check["limit_seconds"]

        routed.healthy = True
        await gate.signals.probe(gate.links["routed"])
        assert health_document(gate)["ok"] is True


async def test_a_stopped_process_is_fresh_without_asking_its_route(tmp_path):
    clock = Clock()
    async with gate_of(tmp_path, clock) as gate:
        control = gate.links["proc"].runtime.lifecycle.control
        assert isinstance(control, FakeProcess)
        control.running = False
        proc = answers(gate, "proc")
        asked = proc.asked
        clock.now += BOUND + START_TIMEOUT + 1
        await gate.signals.probe(gate.links["proc"])
        check = consumer_checks(health_document(gate))["proc"]
        assert (check["ok"], check["fresh"], check["stopped"]) == (True, True, True)
        assert proc.asked == asked
