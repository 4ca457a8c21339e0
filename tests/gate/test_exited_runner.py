"""A runner that exits between NVML's read and `/proc`'s: its bytes are nobody's `other`.

A client unloads qwen2.5:7b at Ollama itself (`keep_alive: 0`, as Ollama's own idle timer
would); the books keep it until Ollama's listing says it is gone. A sample whose NVML read
still lists the runner but whose `/proc` read finds it reaped would count its 5.6 GiB twice
(the resident's and `other`): the card reads as over-committed, and pressure relief evicts
an idle model for nothing. The sampler reads the driver again instead, which no longer
lists the runner.

The simulated card: 16 GiB, 434 MiB driver-reserved, 1 GiB reserve: 14,926 MiB schedulable.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Iterable, Mapping

import ollama

from gpugate.core.effects import EventKind
from gpugate.core.units import MiB
from gpugate.gpu.attribution import Attribution
from gpugate.gpu.sampler import Attributor
from tests.gate.harness import running_stack

PRODUCTION = """\
identities:
  - name: ops
    tokens: [prod-token]
    class: production
"""
REAPED = 30.0
"""Bound on the wait for the runner's reaping; reached only when something is broken."""


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
            deadline = time.monotonic() + REAPED
            while os.path.exists(f"/proc/{self.pid}") and time.monotonic() < deadline:
                time.sleep(0.005)
            self.raced.set()
        return self.inner.attribute(pids)

    def close(self) -> None:
        self.inner.close()  # type: ignore[attr-defined]


async def test_a_runner_reaped_between_the_two_reads_evicts_nobody(
    tmp_path, sim_host, fakenvml_path
):
    async with running_stack(tmp_path, sim_host, fakenvml_path, extra=PRODUCTION) as stack:
        await ollama.AsyncClient(host=stack.gate_url).generate(
            model="gemma3:12b", prompt="x", options={"num_predict": 1}
        )  # interactive, 7,796 MiB
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
