"""The gate's own loops (timer, sampler, listings) survive whatever they are fed, and
/gate/v1/health says when their data is old."""

from __future__ import annotations

import asyncio

import attrs
import pytest
from aiohttp.test_utils import TestClient, TestServer

from gpugate.config.model import Consumer
from gpugate.control.app import control_app
from gpugate.control.metrics import GateMetrics
from gpugate.core.classes import PriorityClass, ResidencyPolicy
from gpugate.core.effects import Event, EventKind
from gpugate.core.failures import FailureClass
from gpugate.core.residents import ResidentKey
from gpugate.core.tickets import Demand
from gpugate.core.units import MiB
from gpugate.gpu.sampler import Sampler
from gpugate.runtimes.registry import runtime_for
from tests.gate.fakes import FakeAttributor, FakeGpu, FakeUpstream, Mode, fake_gate

LLAMA = 3200 * MiB


def llama(ttl: float) -> Demand:
    return Demand(
        key=ResidentKey("ollama", "llama3.2:3b", ""),
        gpu=0,
        envelope=LLAMA,
        priority=PriorityClass.INTERACTIVE,
        resident_priority=PriorityClass.INTERACTIVE,
        policy=ResidencyPolicy.KEEP_WARM,
        idle_ttl=ttl,
    )


def failure_of(cls: FailureClass, consumer: str | None = "ollama"):
    def wanted(event: Event) -> bool:
        return (
            event.kind is EventKind.FAILURE
            and event.failure is not None
            and event.failure.failure_class is cls
            and event.consumer == consumer
        )

    return wanted


def loaded_llama() -> tuple[FakeUpstream, FakeGpu]:
    return FakeUpstream(loaded={"llama3.2:3b": LLAMA}), FakeGpu(held={100: LLAMA})


async def test_an_idle_model_is_unloaded_at_its_ttl_with_no_other_request(tmp_path):
    upstream, gpu = loaded_llama()
    async with fake_gate(tmp_path, upstream=upstream, gpu=gpu) as fakes:
        gate = fakes.gate
        ttl = fakes.gate.events.next(
            lambda e: e.kind is EventKind.EVICTION_STARTED and e.reason == "ttl"
        )
        # The first request arms the timer for its model's TTL; the second moves the
        # TTL later, so the timer fires with nothing due yet and must be set again.
        first = await gate.leases.acquire(llama(ttl=0.2))
        gate.leases.loaded(first)
        gate.leases.release(first)
        second = await gate.leases.acquire(llama(ttl=0.6))
        gate.leases.release(second)
        released_at = gate.clock()
        event = await asyncio.wait_for(ttl, 5)
        assert event.model == "llama3.2:3b"
        assert event.time >= released_at + 0.6 - 0.01
        assert gate.core.leases() == [] and gate.core.waiting() == []


async def test_a_listing_that_is_not_json_is_invalid_output_and_listing_goes_on(tmp_path):
    upstream = FakeUpstream(ps=Mode.GARBAGE)
    async with fake_gate(tmp_path, upstream=upstream) as fakes:
        invalid = fakes.gate.events.next(failure_of(FailureClass.INVALID_OUTPUT))
        assert "/api/ps" in (await asyncio.wait_for(invalid, 5)).failure.message
        found = fakes.gate.events.next(lambda e: e.kind is EventKind.OUT_OF_BAND_RESIDENT)
        upstream.loaded["bge-m3:latest"] = 2012 * MiB
        fakes.gpu.held[101] = 2012 * MiB
        upstream.ps = Mode.OK
        assert (await asyncio.wait_for(found, 5)).model == "bge-m3:latest"


@pytest.mark.parametrize(
    "body",
    [
        [],
        "models",
        {"models": {"name": 3}},
        {"models": [3]},
        {"models": [{"name": ["x"], "size": 1}]},
        {"models": [{"size": 1}]},
        {"models": [{"name": "a", "size": "big"}]},
        {"models": [{"name": "a", "size": 1, "size_vram": {"x": 1}}]},
    ],
)
async def test_any_listing_shape_is_invalid_output(tmp_path, body):
    upstream = FakeUpstream(ps=Mode.SHAPE, shape_body=body)
    async with fake_gate(tmp_path, upstream=upstream) as fakes:
        invalid = fakes.gate.events.next(failure_of(FailureClass.INVALID_OUTPUT))
        await asyncio.wait_for(invalid, 5)
        assert any(t.get_name() == "gpugate-reconcile-ollama" for t in fakes.gate._tasks)


async def test_a_sample_handler_that_raises_does_not_end_sampling():
    sampler = Sampler(FakeGpu(), FakeAttributor())
    calls = 0
    errors: list[BaseException] = []
    second = asyncio.get_running_loop().create_future()

    def on_sample(sample) -> None:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise RuntimeError("handler bug")
        if not second.done():
            second.set_result(sample)

    task = asyncio.create_task(sampler.run(0.01, on_sample, on_error=errors.append))
    try:
        await asyncio.wait_for(second, 5)
    finally:
        task.cancel()
    assert [str(e) for e in errors] == ["handler bug"]


async def health(gate) -> tuple[int, dict]:
    async with (
        TestClient(TestServer(control_app(gate, GateMetrics(gate)))) as client,
        client.get("/gate/v1/health") as resp,
    ):
        return resp.status, await resp.json()


async def wait_health(gate, status: int, timeout: float = 5.0) -> dict:
    """Poll the health check until it answers `status` (it is a poll by nature)."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        got, body = await health(gate)
        if got == status or asyncio.get_running_loop().time() > deadline:
            assert got == status, body
            return body
        await asyncio.sleep(0.05)


async def wait_check(gate, name: str, *, ok: bool, timeout: float = 5.0) -> dict:
    """Poll the health check until its `name` check says `ok` (a poll by nature)."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        _, body = await health(gate)
        if [c["ok"] for c in body["checks"] if c["check"] == name] == [ok]:
            return body
        assert asyncio.get_running_loop().time() <= deadline, body
        await asyncio.sleep(0.05)


async def test_a_failing_sampler_is_driver_error_and_health_turns_bad_then_recovers(tmp_path):
    async with fake_gate(tmp_path) as fakes:
        gate = fakes.gate
        assert (await health(gate))[0] == 200
        failed = gate.events.next(failure_of(FailureClass.DRIVER_ERROR, None))
        fakes.gpu.fail = RuntimeError("attribution exploded")
        assert "attribution exploded" in (await asyncio.wait_for(failed, 5)).failure.message
        # Another check may fail for a moment on a busy machine: wait for the NVML one.
        body = await wait_check(gate, "nvml", ok=False)
        assert body["ok"] is False and (await health(gate))[0] == 503
        (nvml,) = [c for c in body["checks"] if c["check"] == "nvml"]
        assert nvml["age_seconds"] > nvml["limit_seconds"] == 1.0
        fakes.gpu.fail = None
        body = await wait_health(gate, 200)
        assert all(c["ok"] for c in body["checks"])


async def test_a_hung_listing_is_a_timeout_keeps_the_last_listing_and_health_says_so(tmp_path):
    upstream, gpu = loaded_llama()
    async with fake_gate(tmp_path, upstream=upstream, gpu=gpu) as fakes:
        gate = fakes.gate
        found = gate.events.next(lambda e: e.kind is EventKind.OUT_OF_BAND_RESIDENT)
        await asyncio.wait_for(found, 5)
        timed_out = gate.events.next(failure_of(FailureClass.TIMEOUT))
        upstream.ps = Mode.HANG
        event = await asyncio.wait_for(timed_out, 5)
        assert event.failure.message.startswith("TIMEOUT: cannot list what ollama has loaded")
        assert [r.key.model for r in gate.core.residents()] == ["llama3.2:3b"]
        body = await wait_health(gate, 503)
        (listing,) = [c for c in body["checks"] if c["check"] == "listing"]
        assert listing["consumer"] == "ollama"
        # 3 × the listing interval (50 ms) + the control timeout (200 ms)
        assert listing["limit_seconds"] == pytest.approx(0.35)
        assert listing["age_seconds"] > listing["limit_seconds"]
        upstream.ps = Mode.OK
        upstream.released.set()
        await wait_health(gate, 200)
        assert [r.key.model for r in gate.core.residents()] == ["llama3.2:3b"]


async def test_a_refused_listing_is_runtime_crash(tmp_path):
    async with fake_gate(tmp_path) as fakes:
        crashed = fakes.gate.events.next(failure_of(FailureClass.RUNTIME_CRASH))
        link = fakes.gate.links["ollama"]
        # Nothing listens on port 1: the connection is refused.
        link.consumer = refusing(link.consumer)
        link.runtime = runtime_for(link.consumer)
        fakes.gate.want_reconcile("ollama")
        assert "did not answer" in (await asyncio.wait_for(crashed, 5)).failure.message


def refusing(consumer: Consumer) -> Consumer:
    """The consumer with its upstream on a port nothing listens on."""
    return attrs.evolve(consumer, upstream=attrs.evolve(consumer.upstream, port=1))
