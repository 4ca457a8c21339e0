"""A request for a resident model, through the gate on a fake clock: no planner pass, no
timer but the one its resident's idle expiry needs, and everything it leaves behind
(events, counts, the lease history) as for any other lease."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

from gpugate.core.classes import PriorityClass, ResidencyPolicy
from gpugate.core.effects import EventKind
from gpugate.core.residents import ResidentKey
from gpugate.core.tickets import Demand
from gpugate.core.units import MiB
from gpugate.gate.gate import Gate
from gpugate.gpu.sampler import Sampler
from gpugate.runtimes.sections import load_config_text
from gpugate.store.db import Store
from tests.gate.fakes import FakeAttributor, FakeGpu, gate_config

KEY = ResidentKey("ollama", "gemma3:12b")
WANTED = Demand(
    KEY,
    0,
    7796 * MiB,
    PriorityClass.INTERACTIVE,
    PriorityClass.INTERACTIVE,
    ResidencyPolicy.KEEP_WARM,
    900.0,
)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@contextlib.asynccontextmanager
async def resident_gate(tmp_path: Path) -> AsyncIterator[tuple[Gate, Clock]]:
    """A gate (its loops not started) whose books have KEY resident and idle."""
    config = load_config_text(gate_config("http://127.0.0.1:9", tmp_path), tmp_path / "c.yaml")
    clock = Clock()
    store = Store(None)
    sampler = Sampler(FakeGpu(), FakeAttributor(), clock=clock)
    gate = Gate(config, sampler, store=store, clock=clock)
    await store.open()
    try:
        gate.observe(await gate.sampler.sample())
        lease = await gate.leases.acquire(WANTED)
        assert lease.pending
        gate.leases.loaded(lease)
        gate.leases.release(lease)
        await store.flush()
        yield gate, clock
    finally:
        if gate._timer is not None:
            gate._timer.cancel()
        await store.close()


def refuse(*args: object, **kwargs: object) -> None:
    raise AssertionError("the resident path took the full one")


async def test_a_resident_lease_plans_nothing_and_sets_no_timer(tmp_path, monkeypatch):
    async with resident_gate(tmp_path) as (gate, clock):
        timer, timer_at = gate._timer, gate._timer_at
        assert timer is not None and timer_at == 1900.0  # the resident's idle expiry
        core = gate.core
        for name in ("submit", "release", "next_wakeup"):
            monkeypatch.setattr(core, name, refuse)
        monkeypatch.setattr(core.scheduler, "schedule", refuse)
        recent = len(gate.recent_events())

        clock.now = 1010.0
        lease = await gate.leases.acquire(WANTED)
        assert (lease.pending, lease.waited, lease.loads) == (0, 0.0, False)
        clock.now = 1012.0
        gate.leases.release(lease)

        # The timer set for the resident's earlier expiry stays: it moves the timer on.
        assert (gate._timer, gate._timer_at) == (timer, timer_at)
        assert core.leases() == []
        resident = core.resident(KEY)
        assert resident is not None and resident.expires_at() == 1912.0
        events = gate.recent_events()[recent:]
        assert [(e.kind, e.time, e.bytes, e.wait, e.reason) for e in events] == [
            (EventKind.LEASE_GRANTED, 1010.0, 0, 0.0, None),
            (EventKind.LEASE_RELEASED, 1012.0, None, 0.0, "done"),
        ]
        assert gate.events.tally.granted == {("ollama", PriorityClass.INTERACTIVE): 2}
        assert gate.store is not None and gate.store.buffered == 1
        await gate.store.flush()


async def test_a_resident_left_idle_with_no_timer_set_gets_one_for_its_expiry(tmp_path):
    async with resident_gate(tmp_path) as (gate, clock):
        assert gate._timer is not None
        gate._timer.cancel()
        gate._timer = None  # as after a tick that found nothing timed
        lease = await gate.leases.acquire(WANTED)
        assert gate._timer is None  # a busy resident has no expiry
        clock.now = 1020.0
        gate.leases.release(lease)
        assert gate._timer is not None and gate._timer_at == 1920.0


async def test_a_failed_resident_request_is_recorded_as_failed(tmp_path):
    async with resident_gate(tmp_path) as (gate, clock):
        lease = await gate.leases.acquire(WANTED)
        clock.now = 1003.0
        gate.leases.release(lease, failed=True)
        (released,) = [e for e in gate.recent_events() if e.time == 1003.0]
        assert released.kind is EventKind.LEASE_RELEASED and released.reason == "failed"
        assert gate.store is not None
        await gate.store.flush()
        assert gate.store._db is not None
        # Served at once from a resident: counted in its minute's row, not a row of its own.
        async with gate.store._db.execute(
            "SELECT model, leases, held_max, outcome FROM lease_minutes WHERE outcome = 'failed'"
        ) as cursor:
            rows = await cursor.fetchall()
        assert rows == [(lease.key.model, 1, 3.0, "failed")]
