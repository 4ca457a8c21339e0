"""`gpugate serve` in the test's own event loop, as each stack and corpus runs it.

`serving` starts it on a loaded configuration, waits for it to be ready and yields its
gate and what it printed; the block's end stops it. `GATE_PREAMBLE` is the `gate:` and
`budget:` part most of those configurations share (formatted with `control` and
`library`), ending where their consumers begin.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable

import attrs

from gpugate.config.model import Config
from gpugate.gate.gate import Gate
from gpugate.gpu.sampler import Sampler
from gpugate.serve import serve
from gpugate.store.db import Store

GATE_PREAMBLE = """\
gate:
  control: 127.0.0.1:{control}
  shutdown_grace: 2s
  nvml_library: {library}
budget:
  reserve: 1GiB
  reserve_max: 1GiB
  sample_interval: 200ms
  stale_after: 5s
  reclaim_timeout: 5s
consumers:
"""


@attrs.frozen
class Served:
    """A running gate and the lines it printed once ready."""

    gate: Gate
    lines: list[str]


def real_gate(config: Config) -> Gate:
    """The gate `gpugate serve` makes: the sampler and store its configuration names."""
    return Gate(config, Sampler.from_config(config), store=Store(config.gate.database))


@contextlib.asynccontextmanager
async def serving(
    config: Config,
    *,
    gate_factory: Callable[[Config], Gate] = real_gate,
    ready_within: float = 20.0,
) -> AsyncIterator[Served]:
    """`gpugate serve` on `config`, ready, until the block ends."""
    gates: list[Gate] = []

    def make_gate(cfg: Config) -> Gate:
        gates.append(gate_factory(cfg))
        return gates[-1]

    ready: asyncio.Future[list[str]] = asyncio.get_running_loop().create_future()
    stop = asyncio.Event()
    task = asyncio.create_task(
        serve(config, stop, on_ready=ready.set_result, gate_factory=make_gate)
    )
    try:
        lines = await asyncio.wait_for(asyncio.shield(ready), ready_within)
        yield Served(gates[0], lines)
    finally:
        stop.set()
        await asyncio.wait_for(task, 30)
