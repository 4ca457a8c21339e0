"""A small simulated host and a gate in front of it, written as files, for the fault matrix.

Every case gets its own ports and directory; timeouts are seconds, not minutes.
"""

from __future__ import annotations

import asyncio
import contextlib
import textwrap
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
import attrs
from multidict import CIMultiDict

from tests.clihost import GateProcess, HostProcess, running_host
from tests.ports import free_ports

MODELS = {"gemma3:12b": 7796, "llama3.2:3b": 3200, "bge-m3": 2012}  # MiB
"""Models of the simulated Ollama, each with its envelope in the gate's config."""
CLASSES = {"llama3.2:3b": "background"}
"""Models not of the consumer's class (interactive): what an interactive load may evict."""
CAPACITY_CLASSES = {
    "QUEUE_FULL",
    "LEASE_TIMEOUT",
    "DEADLINE_CANNOT_BE_MET",
    "INSUFFICIENT_SCHEDULABLE_VRAM",
    "EXTERNAL_GPU_PRESSURE",
    "UNLEASED_GPU_USE",
    "SCHEDULER_STATE_STALE",
    "DRIVER_ERROR",
}
T = TypeVar("T")


def host_yaml(
    ollama_port: int | None, *, holders: str = "", preload: str = "", faults: str = ""
) -> str:
    """A 16 GiB card, a Plex transcode (1.5 GiB) and, unless port is None, a simulated Ollama
    set as with OLLAMA_NUM_PARALLEL=4 (the faults run several streams on one model at once;
    Ollama's own default is 1)."""
    text = (
        textwrap.dedent("""\
        gpus:
          - {name: NVIDIA GeForce RTX 4080, total: 16GiB, reserved: 434MiB}
        holders:
          - name: Plex Transcoder
            command: ["/usr/lib/plexmediaserver/Plex Transcoder", "-codec:0", "hevc"]
            bytes: 1536MiB
        """)
        + holders
    )
    if ollama_port is None:
        return text
    models = "".join(
        f"    - {{name: '{name}', size: {mib}MiB, load_seconds: 0.05, "
        f"embedding: {str(name == 'bge-m3').lower()}}}\n"
        for name, mib in MODELS.items()
    )
    text += (
        textwrap.dedent(f"""\
        ollama:
          listen: 127.0.0.1:{ollama_port}
          tokens_per_second: 200
          keep_alive: 5m
          num_parallel: 4
          models:
        """)
        + models
    )
    if preload:
        text += "  preload:\n" + textwrap.indent(textwrap.dedent(preload), "    ")
    if faults:
        text += "  faults: " + faults + "\n"
    return text


def gate_yaml(
    listen: int,
    control: int,
    upstream: int,
    *,
    database: Path | None = None,
    ttl: str = "20s",
    timeouts: str = "{connect: 1s, first_byte: 2s, idle: 1s, control: 1s}",
    budget: str = "",
    settings: str = "",
    extra: str = "",
) -> str:
    """consumers.yaml: one Ollama consumer with every model's envelope, Plex as external.
    `settings`: more lines of the `gate:` section; `extra`: more top-level sections."""
    models = "".join(
        f"      {name}: {{envelope: {mib}MiB, class: {CLASSES.get(name, 'interactive')}}}\n"
        for name, mib in MODELS.items()
    )
    db = f"  database: {database}\n" if database else ""
    return (
        textwrap.dedent(f"""\
        gate:
          control: 127.0.0.1:{control}
          shutdown_grace: 2s
        """)
        + textwrap.indent(textwrap.dedent(settings), "  ")
        + db
        + textwrap.dedent("""\
        budget:
          reserve: 1GiB
          reserve_max: 1GiB
          sample_interval: 100ms
          stale_after: 1s
          reclaim_timeout: 2s
        """)
        + budget
        + textwrap.dedent(f"""\
        classes:
          interactive: {{max_wait: 3s}}
          background: {{max_wait: 3s}}
        consumers:
          ollama:
            runtime: ollama
            listen: 127.0.0.1:{listen}
            upstream: http://127.0.0.1:{upstream}
            class: interactive
            queue_limit: 8
            residency: {{policy: keep_warm, ttl: {ttl}}}
            timeouts: {timeouts}
            processes: {{commands: ["ollama serve"]}}
            models:
        """)
        + models
        + textwrap.dedent("""\
        external:
          plex:
            processes: {commands: ["Plex Transcoder"]}
        """)
        + textwrap.dedent(extra)
    )


@attrs.define
class Stack:
    """A simulated host and a gate as subprocesses, and the files they were started from."""

    directory: Path
    host: HostProcess
    gate: GateProcess
    upstream_port: int
    listen_port: int
    control_port: int

    @property
    def url(self) -> str:
        return self.gate.listen

    def restart_gate(self) -> GateProcess:
        """A new gate process on the same config and ports (after the old one is gone)."""
        old = self.gate
        self.gate = GateProcess(old.config, old.env, old.listen, old.control)
        return self.gate.start()


@contextlib.asynccontextmanager
async def stack(
    directory: Path,
    *,
    with_ollama: bool = True,
    upstream_port: int | None = None,
    host: dict[str, Any] | None = None,
    gate: dict[str, Any] | None = None,
) -> AsyncIterator[Stack]:
    """Start `gpugate sim run` and `gpugate serve` in `directory`; stop both after."""
    ollama_port, listen, control = free_ports(3)
    upstream = upstream_port if upstream_port is not None else ollama_port
    host_file = directory / "host.yaml"
    host_file.write_text(host_yaml(ollama_port if with_ollama else None, **(host or {})))
    config = directory / "consumers.yaml"
    config.write_text(gate_yaml(listen, control, upstream, **(gate or {})))
    with running_host(host_file, directory / "state", ollama_port if with_ollama else None) as h:
        g = GateProcess(
            config, h.env(), f"http://127.0.0.1:{listen}", f"http://127.0.0.1:{control}"
        )
        built = Stack(directory, h, g, upstream, listen, control)
        try:
            await asyncio.to_thread(g.start)
            yield built
        finally:
            await asyncio.to_thread(built.gate.stop)


async def eventually(
    probe: Callable[[], Awaitable[T]],
    check: Callable[[T], bool],
    timeout: float = 10.0,
    interval: float = 0.05,
) -> T:
    """Poll `probe` until `check` holds; AssertionError with the last value after `timeout`.

    Used only for state another process owns (the gate's status, the sim's counters),
    which no in-process future can signal.
    """
    deadline = time.monotonic() + timeout
    while True:
        value = await probe()
        if check(value):
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout}s; last: {value!r}")
        await asyncio.sleep(interval)


async def post(
    url: str, body: Any, *, timeout: float = 20.0, headers: dict[str, str] | None = None
) -> tuple[int, CIMultiDict[str], bytes]:
    """POST JSON; status, headers (any case: Go's server writes names canonical, so the
    gate's `X-GPUGate-*` reach an Ollama client as `X-Gpugate-*`) and the whole body."""
    async with (
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout)) as session,
        session.post(url, json=body, headers=headers) as resp,
    ):
        return resp.status, CIMultiDict(resp.headers), await resp.read()


def failures(events: list[dict[str, Any]], failure_class: str) -> list[dict[str, Any]]:
    """The failure events of one class."""
    return [e for e in events if e.get("event") == "failure" and e.get("class") == failure_class]


async def assert_nothing_lost(s: Stack, *, committed: int | None = None) -> None:
    """No lease, no ticket, no request the sim still serves, committed bytes back."""
    document = await eventually(
        s.gate.status, lambda d: d["leases"] == [] and d["queue"] == [], timeout=5
    )
    assert document["leases"] == [] and document["queue"] == []
    if s.host.ollama is not None:
        await eventually(
            s.host.sim_state, lambda st: st["counters"]["requests_in_flight"] == 0, timeout=5
        )
    if committed is not None:
        await eventually(
            s.gate.status, lambda d: d["gpus"][0]["committed_total"] == committed, timeout=5
        )
