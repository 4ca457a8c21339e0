"""A runner that exits in the middle of a sample: its bytes count once, and evict nobody.

Two windows, each held open here until the runner is reaped: between NVML's read and
`/proc`'s (the sampler reads the driver again), and between NVML's process lists and its
second reading of used memory (the lists are read again). Samples are taken only when the
gate asks for one (an interval of an hour), so which sample meets the runner is known.

The simulated card: 16 GiB, 434 MiB driver-reserved, 1 GiB reserve: 14,926 MiB schedulable.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
import time
from collections.abc import AsyncIterator, Iterable, Mapping

import ollama

from gpugate.core.effects import Event, EventKind
from gpugate.core.units import MiB
from gpugate.gpu.attribution import Attribution
from gpugate.gpu.proclists import ProcessLists
from gpugate.gpu.sampler import Attributor
from gpugate_sim.ollama.process import RunnerProcess
from tests.gate.harness import PRODUCTION, Stack, running_stack

REAPED = 30.0
"""Bound on the wait for the runner's reaping; reached only when something is broken."""


def wait_reaped(pid: int) -> None:
    """Until the process has left /proc (in a sampler's thread: the event loop reaps it)."""
    deadline = time.monotonic() + REAPED
    while os.path.exists(f"/proc/{pid}") and time.monotonic() < deadline:
        time.sleep(0.005)


@contextlib.asynccontextmanager
async def quiet_stack(tmp_path, sim_host, fakenvml_path) -> AsyncIterator[Stack]:
    """A gate that samples only when asked, with gemma3:12b (interactive, 7,796 MiB) loaded."""
    async with running_stack(
        tmp_path, sim_host, fakenvml_path, extra=PRODUCTION, sample_interval="1h", stale_after="2h"
    ) as stack:
        await ollama.AsyncClient(host=stack.gate_url).generate(
            model="gemma3:12b", prompt="x", options={"num_predict": 1}
        )
        yield stack


class ReapedFirst:
    """Attributes like `inner`, except that the first sample listing `pid` after `armed` is
    set is attributed only once that process has left `/proc` (in the sampler's thread)."""

    def __init__(self, inner: Attributor, pid: int) -> None:
        self.inner = inner
        self.pid = pid
        self.armed = threading.Event()
        self.entered = threading.Event()
        self.raced = threading.Event()

    def attribute(self, pids: Iterable[int]) -> Mapping[int, Attribution]:
        pids = list(pids)
        if self.armed.is_set() and not self.entered.is_set() and self.pid in pids:
            self.entered.set()
            wait_reaped(self.pid)
            self.raced.set()
        return self.inner.attribute(pids)

    def close(self) -> None:
        self.inner.close()  # type: ignore[attr-defined]


async def test_a_runner_reaped_between_the_two_reads_evicts_nobody(
    tmp_path, sim_host, fakenvml_path
):
    # A client unloads qwen2.5:7b at Ollama itself (`keep_alive: 0`, as Ollama's own idle
    # timer would): the books keep it until Ollama's listing says it is gone. A sample whose
    # NVML read lists its runner, no sample having seen it, but whose /proc read finds it
    # reaped would count its 5.6 GiB twice (the resident's and `other`): the card would
    # read as over-committed, and pressure relief would evict gemma3:12b for nothing.
    async with quiet_stack(tmp_path, sim_host, fakenvml_path) as stack:
        await ollama.AsyncClient(
            host=stack.gate_url, headers={"Authorization": "Bearer prod-token"}
        ).generate(model="qwen2.5:7b", prompt="x", options={"num_predict": 1})
        runner = next(p.pid for p in sim_host.read().processes if p.used == 5700 * MiB)
        sampler = stack.gate.sampler
        racing = ReapedFirst(sampler.attributor, runner)
        sampler.attributor = racing
        racing.armed.set()
        # A read that lists the runner, held before /proc is read while Ollama stops it.
        held = asyncio.create_task(sampler.sample())
        assert await asyncio.to_thread(racing.entered.wait, REAPED)
        unloaded = await ollama.AsyncClient(host=stack.sim_url).generate(
            model="qwen2.5:7b", keep_alive=0
        )
        assert unloaded.done_reason == "unload"
        observation = await held
        assert racing.raced.is_set() and not os.path.exists(f"/proc/{runner}")
        stack.gate.observe(observation)
        kinds = {e.kind for e in stack.gate.recent_events()}
        assert EventKind.PRESSURE_ENTERED not in kinds, stack.trail()
        gpu = observation.device(0)
        assert gpu is not None and gpu.external == {}
        assert gpu.managed == {"ollama": 7796 * MiB}
        # The next sample too: what the card holds is gemma3's alone, nobody evicted.
        stack.gate.observe(await sampler.sample())
        trail = stack.trail()
        kinds = {e.kind for e in stack.gate.recent_events()}
        assert EventKind.PRESSURE_ENTERED not in kinds, trail
        assert EventKind.EVICTION_STARTED not in kinds, trail
        assert [m["name"] for m in await stack.ps()] == ["gemma3:12b"], trail
        budget = stack.gate.core.telemetry.budget(0, stack.gate.core.books)
        assert budget is not None and budget.external == ()
        assert stack.gate.core.leases() == [] and stack.host.ooms() == []


async def test_a_runner_that_exits_just_after_the_process_lists_evicts_nobody_else(
    tmp_path, sim_host, fakenvml_path, monkeypatch
):
    # bge-m3 is evicted for qwen2.5:7b; its runner exits right after the unload check's
    # first sample read the process lists, before that sample's second reading of used
    # memory. The lower reading shows its memory back, so the unload is confirmed and
    # bge-m3 leaves the books: lists that still named the runner would show its 2 GiB under
    # Ollama, unexplained, and qwen's plan would find 5.0 GiB where 7.0 are and evict
    # gemma3:12b as well. The simulated Ollama's kill of the runner waits for that read.
    loop = asyncio.get_running_loop()
    may_kill = asyncio.Event()
    runner: dict[str, int] = {}
    listed_alive, reaped = threading.Event(), threading.Event()
    kill, lists_read = RunnerProcess.kill, ProcessLists.read

    async def held_kill(self: RunnerProcess) -> None:
        if self.pid == runner.get("bge"):
            await may_kill.wait()
        await kill(self)

    def exiting_after(self: ProcessLists, handle: object, index: int):  # type: ignore[no-untyped-def]
        listed = lists_read(self, handle, index)
        pid = runner.get("bge")
        if pid in {p.pid for p in listed[0]} and not listed_alive.is_set():
            listed_alive.set()
            loop.call_soon_threadsafe(may_kill.set)
            wait_reaped(pid)
            reaped.set()
        return listed

    monkeypatch.setattr(RunnerProcess, "kill", held_kill)
    monkeypatch.setattr(ProcessLists, "read", exiting_after)
    async with quiet_stack(tmp_path, sim_host, fakenvml_path) as stack:
        await ollama.AsyncClient(host=stack.gate_url).embed(model="bge-m3", input="x")
        # What the unload check compares with: both runners, as a periodic sample shows.
        stack.gate.observe(await stack.gate.sampler.sample())
        bge = next(p.pid for p in sim_host.read().processes if p.used == 2012 * MiB)
        started = []

        def arm(event: Event) -> None:
            if event.kind is EventKind.EVICTION_STARTED:
                started.append(event.model)
                runner["bge"] = bge

        stack.gate.events.subscribe(arm)
        await ollama.AsyncClient(
            host=stack.gate_url, headers={"Authorization": "Bearer prod-token"}
        ).generate(model="qwen2.5:7b", prompt="x", options={"num_predict": 1})
        assert listed_alive.is_set() and reaped.is_set()
        assert started == ["bge-m3:latest"], stack.trail()
        listed = sorted(m["name"] for m in await stack.ps())
        assert listed == ["gemma3:12b", "qwen2.5:7b"], stack.trail()
        assert stack.gate.core.leases() == [] and stack.host.ooms() == []
