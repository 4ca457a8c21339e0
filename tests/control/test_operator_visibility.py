"""A paused GPU and a draining consumer are visible wherever the gate is read: the status
document (since when, by whom, how to undo), the consumer route and the metrics; the
queue gauge has a sample for every GPU and class; the health gauge follows the health
route."""

from __future__ import annotations

import asyncio
import time

import pytest

from gpugate.core.classes import PriorityClass
from gpugate.core.effects import EventKind
from tests.control.operated import STALE_AFTER, auth, operated_gate

GPU0 = (("gpu", "0"),)
NOT_PAUSED = {
    "paused": False,
    "paused_since": None,
    "paused_seconds": None,
    "paused_by": None,
    "undo": None,
}


def draining(consumer: str) -> tuple[str, tuple]:
    return "gpugate_consumer_draining", (("consumer", consumer),)


async def test_a_pause_shows_since_when_and_by_whom_until_it_is_resumed(tmp_path):
    async with operated_gate(tmp_path) as op:
        (gpu,) = (await op.get("/gate/v1/status"))["gpus"]
        assert {k: gpu[k] for k in NOT_PAUSED} == NOT_PAUSED
        values = await op.metrics()
        assert values[("gpugate_gpu_paused", GPU0)] == 0
        assert values[("gpugate_gpu_paused_seconds", GPU0)] == 0

        status, body = await op.post("/gate/v1/gpus/0/pause")
        assert status == 200
        assert body["paused"] is True and body["paused_by"] == "token"
        assert body["paused_seconds"] == 0 and body["undo"] == "gpugate resume --gpu 0"

        op.clock.now += 754.5
        (gpu,) = (await op.get("/gate/v1/status"))["gpus"]
        assert gpu["paused"] is True
        assert gpu["paused_seconds"] == 754.5
        assert gpu["paused_by"] == "token"
        assert gpu["paused_since"] == pytest.approx(time.time() - 754.5, abs=5)
        assert gpu["undo"] == "gpugate resume --gpu 0"
        values = await op.metrics()
        assert values[("gpugate_gpu_paused", GPU0)] == 1
        assert values[("gpugate_gpu_paused_seconds", GPU0)] == 754.5

        status, body = await op.post("/gate/v1/gpus/0/resume")
        assert status == 200 and body == {"gpu": 0, **NOT_PAUSED}
        (gpu,) = (await op.get("/gate/v1/status"))["gpus"]
        assert {k: gpu[k] for k in NOT_PAUSED} == NOT_PAUSED
        values = await op.metrics()
        assert values[("gpugate_gpu_paused", GPU0)] == 0
        assert values[("gpugate_gpu_paused_seconds", GPU0)] == 0


async def test_a_drain_shows_draining_then_drained_and_clears_on_undrain(tmp_path):
    async with operated_gate(tmp_path) as op:
        status, lease = await op.post(
            "/gate/v1/leases", {"consumer": "trainer", "bytes": "2GiB", "ttl": 3600}
        )
        assert status == 201, lease
        status, body = await op.post("/gate/v1/consumers/trainer/drain")
        assert status == 200
        assert (body["draining"], body["drained"], body["leases"]) == (True, False, 1)
        assert body["draining_by"] == "token" and body["undo"] == "gpugate undrain trainer"

        op.clock.now += 60
        document = await op.get("/gate/v1/status")
        consumers = {c["consumer"]: c for c in document["consumers"]}
        assert list(consumers) == ["trainer", "render"]
        trainer = consumers["trainer"]
        assert (trainer["draining"], trainer["drained"], trainer["gpu"]) == (True, False, 0)
        assert trainer["draining_seconds"] == 60
        assert trainer["draining_since"] == pytest.approx(time.time() - 60, abs=5)
        assert consumers["render"]["draining"] is False
        assert consumers["render"]["draining_since"] is None
        shown = await op.get("/gate/v1/consumers/trainer")
        # The same document, read a moment later (the wall time of `since` is computed).
        assert shown["draining_since"] == pytest.approx(trainer.pop("draining_since"), abs=1)
        assert {k: v for k, v in shown.items() if k != "draining_since"} == trainer
        values = await op.metrics()
        assert values[draining("trainer")] == 1 and values[draining("render")] == 0

        async with op.client.delete(f"/gate/v1/leases/{lease['id']}", headers=auth()) as resp:
            assert resp.status == 200
        trainer = await op.get("/gate/v1/consumers/trainer")
        assert (trainer["draining"], trainer["drained"], trainer["leases"]) == (True, True, 0)
        # Drained is still draining: the metric stays 1 until undrain.
        assert (await op.metrics())[draining("trainer")] == 1

        status, body = await op.post("/gate/v1/consumers/trainer/undrain")
        assert status == 200
        assert (body["draining"], body["drained"]) == (False, False)
        assert body["draining_since"] is None and body["draining_by"] is None
        assert body["undo"] is None
        assert (await op.metrics())[draining("trainer")] == 0


async def test_a_demand_waiting_behind_a_pause_is_counted_and_every_class_has_a_sample(
    tmp_path,
):
    async with operated_gate(tmp_path) as op:
        # Nothing waits: still one sample per GPU and class, each 0.
        values = await op.metrics()
        queue = {k: v for k, v in values.items() if k[0] == "gpugate_queue_tickets"}
        assert queue == {
            ("gpugate_queue_tickets", (("class", p.label), ("gpu", "0"))): 0 for p in PriorityClass
        }

        await op.post("/gate/v1/gpus/0/pause")
        queued = op.gate.events.next(lambda e: e.kind is EventKind.TICKET_QUEUED)
        ask = asyncio.ensure_future(
            op.post(
                "/gate/v1/leases",
                {"consumer": "render", "bytes": "1GiB", "class": "background", "max_wait": 600},
            )
        )
        await asyncio.wait_for(queued, 10)
        op.clock.now += 900
        document = await op.get("/gate/v1/status")
        assert [t["consumer"] for t in document["queue"]] == ["render"]
        assert document["gpus"][0]["paused_seconds"] == 900
        values = await op.metrics()
        assert values[("gpugate_queue_tickets", (("class", "background"), ("gpu", "0")))] == 1
        assert values[("gpugate_queue_tickets", (("class", "interactive"), ("gpu", "0")))] == 0

        await op.post("/gate/v1/gpus/0/resume")
        status, lease = await asyncio.wait_for(ask, 10)
        assert status == 201, lease
        values = await op.metrics()
        assert values[("gpugate_queue_tickets", (("class", "background"), ("gpu", "0")))] == 0


async def test_actions_taken_before_the_control_app_existed_are_known(tmp_path):
    def before(gate):
        gate.pause(0, who="alice")
        gate.drain("render", who="bob")

    async with operated_gate(tmp_path, before=before) as op:
        op.clock.now += 30
        document = await op.get("/gate/v1/status")
        (gpu,) = document["gpus"]
        assert (gpu["paused"], gpu["paused_by"], gpu["paused_seconds"]) == (True, "alice", 30)
        render = next(c for c in document["consumers"] if c["consumer"] == "render")
        assert (render["drained"], render["draining_by"], render["draining_seconds"]) == (
            True,
            "bob",
            30,
        )


async def test_the_core_is_the_record_of_a_pause_not_its_event(tmp_path):
    def before(gate):
        # The core's books change, its event is never published: the core still says
        # since when and by whom.
        gate.core.operator.pause(0, gate.clock(), "carol")

    async with operated_gate(tmp_path, before=before) as op:
        op.clock.now += 5
        (gpu,) = (await op.get("/gate/v1/status"))["gpus"]
        assert (gpu["paused"], gpu["paused_seconds"], gpu["paused_by"]) == (True, 5, "carol")
        values = await op.metrics()
        assert values[("gpugate_gpu_paused", GPU0)] == 1
        assert values[("gpugate_gpu_paused_seconds", GPU0)] == 5


async def test_the_health_gauge_is_what_the_health_route_answers(tmp_path):
    async with operated_gate(tmp_path) as op:
        async with op.client.get("/gate/v1/health") as resp:
            assert resp.status == 200
        assert (await op.metrics())[("gpugate_healthy", ())] == 1
        # No sample for longer than stale_after: the nvml check fails.
        op.clock.now += STALE_AFTER + 1
        async with op.client.get("/gate/v1/health") as resp:
            assert resp.status == 503
            assert (await resp.json())["failed"] == ["nvml"]
        assert (await op.metrics())[("gpugate_healthy", ())] == 0
