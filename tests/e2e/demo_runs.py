"""`gpugate demo` in the README's order, N fresh runs: qwen2.5:7b through the gate, then the
printed FLUX prompt, each run a new demo (its own simulated host and gate, on ports of its
own), then ComfyUI told to free its memory (`POST /free`). Counted over the runs: FLUX
renders; evictions started for a demand that was then refused; the reserve against its base
(the demo's card runs nothing external, so it must stay there); how long after the `/free`
the models evicted for FLUX were resident again, warmed by the gate with nobody asking.

Fresh demos had seen FLUX refused after the gate had evicted bge-m3 and qwen2.5:7b for it in
4 of 19: the gate's own unloads had grown the reserve from 1 GiB to 2 GiB.

    python -m tests.e2e.demo_runs --runs 50      (make demo-runs)

prints a line per run and the counts; it exits 1 when a run fell short. The test suite runs
a few (tests/e2e/test_demo_runs.py).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence

import aiohttp
import attrs
import yaml

from gpugate.commands.demo import DEFAULT_CONFIG, FLUX_PROMPT, demo_ports
from gpugate.core.units import format_gib, parse_size
from gpugate.gate.exchange import DEGRADED_HEADER
from tests.e2e.test_installed_demo import free_port_base, start_demo
from tests.sim.processes import LineReader, kill_quietly

BASE_RESERVE = parse_size(yaml.safe_load(DEFAULT_CONFIG.read_text())["budget"]["reserve"])
"""The demo's `budget.reserve`: where its reserve stays with no external use."""
RENDER_TIMEOUT = 240.0
"""Generous: FLUX waits for qwen2.5:7b to be idle 30 s (same class), then renders."""
WARM_TIMEOUT = 60.0
WARMED = frozenset({"gemma3:12b", "bge-m3:latest"})
"""What the demo finds loaded, FLUX's render evicts and the gate warms again."""


@attrs.frozen
class DemoRun:
    """What one fresh demo did."""

    qwen: int
    """The status of qwen2.5:7b's /api/generate through the gate."""
    queued: int
    """The status of the FLUX prompt's POST /prompt through the gate."""
    rendered: str | None
    """Its /history status_str (None: none within the timeout)."""
    evicted_then_refused: int
    """Demands that had residents evicted for them and were then refused."""
    reserve_before: int
    reserve_max: int
    reserve_after: int
    external_max: int
    """The most external use any status showed during the run (the demo's card runs
    nothing external: what shows is the gate's own memory on its way back)."""
    failures: tuple[str, ...]
    overruns: int
    """`overrun` events: a consumer holding more than the gate leased it."""
    seconds: float
    error: str = ""
    degraded: str | None = None
    """FLUX's `X-GPUGate-Degraded` header: its 17.2 GiB of files and working set can never
    be had on the 16 GiB card beside whisper (always_warm), so it is granted the most it
    could ever have, and ComfyUI loads the UNet partly."""
    degraded_events: tuple[dict, ...] = ()
    warm_again: float | None = None
    """Seconds from ComfyUI's `POST /free` (through the gate, after the render) until the
    models evicted for FLUX were resident again, loaded by the gate with nobody asking
    (None: not within WARM_TIMEOUT)."""

    @property
    def ok(self) -> bool:
        return (
            self.qwen == 200
            and self.queued == 200
            and self.rendered == "success"
            and self.evicted_then_refused == 0
            and self.reserve_max == BASE_RESERVE
            and self.warm_again is not None
            and not self.error
        )

    def line(self) -> str:
        return (
            f"qwen {self.qwen}, FLUX {self.queued} {self.rendered or 'not rendered'}, "
            f"evicted then refused {self.evicted_then_refused}, reserve "
            f"{format_gib(self.reserve_before)} → max {format_gib(self.reserve_max)} → "
            f"{format_gib(self.reserve_after)}, external max {format_gib(self.external_max)}, "
            f"overruns {self.overruns}, degraded {self.degraded or 'no'}, warm again "
            + ("never" if self.warm_again is None else f"{self.warm_again:.2f}s")
            + f" after /free, {self.seconds:.0f}s"
            + "".join(f"\n    {failure}" for failure in self.failures)
            + (f"\n    {self.error}" if self.error else "")
        )


def evicted_then_refused(events: Sequence[dict]) -> int:
    """How many demands had an eviction started for them (its event's detail names the
    demand) and then failed."""
    evicted_for: set[str] = set()
    refused: set[str] = set()
    for event in events:
        if event.get("event") == "eviction_started":
            detail = event.get("detail", "")
            if detail.startswith("for "):
                evicted_for.add(detail[4:].split(" (")[0].split(" [")[0])
        elif event.get("event") == "failure" and event.get("model"):
            demand = f"{event['consumer']}/{event['model']}"
            if demand in evicted_for:
                refused.add(demand)
    return len(refused)


async def demo_run(*, timeout: float = RENDER_TIMEOUT) -> DemoRun:
    """One fresh demo, the README's order, then stopped."""
    started = time.monotonic()
    base = free_port_base()
    ports = demo_ports(base)
    with tempfile.TemporaryFile("w+") as log:
        demo = start_demo(
            base,
            stderr=log,  # the gate's log and events: read back only when a run goes wrong
        )
        try:
            LineReader(demo.stdout).until("Events follow", timeout=120)
            try:
                return await _readme_order(ports, started, timeout)
            except (aiohttp.ClientError, TimeoutError, KeyError) as exc:
                log.seek(0)
                tail = "\n    ".join(log.read().splitlines()[-20:])
                alive = "running" if demo.poll() is None else f"exited {demo.returncode}"
                return _broken(f"{exc!r}; the demo {alive}; its log ends:\n    {tail}", started)
        finally:
            if demo.poll() is None:
                os.killpg(demo.pid, signal.SIGTERM)
                try:
                    demo.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    os.killpg(demo.pid, signal.SIGKILL)
            kill_quietly(demo)


async def _readme_order(ports: dict[str, int], started: float, timeout: float) -> DemoRun:
    """qwen2.5:7b through the gate, then the FLUX prompt, the gate's status read throughout."""
    control = f"http://127.0.0.1:{ports['control']}"
    comfyui = f"http://127.0.0.1:{ports['comfyui']}"
    async with aiohttp.ClientSession() as session:
        watch = _Watch(session, control)
        await watch.settled()
        reserve_before = watch.reserve
        polling = asyncio.create_task(watch.poll())
        try:
            qwen = await _post(
                session,
                f"http://127.0.0.1:{ports['ollama']}/api/generate",
                json.dumps({"model": "qwen2.5:7b", "prompt": "hi"}).encode(),
            )
            queued, answer, degraded = await _post_json(
                session, comfyui + "/prompt", FLUX_PROMPT.read_bytes()
            )
            rendered = None
            warm_again = None
            if queued == 200:
                rendered = await _rendered(session, comfyui, answer["prompt_id"], timeout)
            if rendered == "success":
                warm_again = await _warm_again(session, comfyui, watch)
        finally:
            polling.cancel()
        await watch.read()
        async with session.get(control + "/gate/v1/events") as resp:
            events = [json.loads(line) for line in (await resp.text()).splitlines() if line]
    failures = tuple(
        e.get("message") or e.get("detail", "") for e in events if e.get("event") == "failure"
    )
    return DemoRun(
        qwen=qwen,
        queued=queued,
        rendered=rendered,
        evicted_then_refused=evicted_then_refused(events),
        reserve_before=reserve_before,
        reserve_max=watch.reserve_max,
        reserve_after=watch.reserve,
        external_max=watch.external_max,
        failures=failures,
        overruns=sum(1 for e in events if e.get("event") == "overrun"),
        seconds=time.monotonic() - started,
        degraded=degraded,
        degraded_events=tuple(e for e in events if e.get("event") == "degraded"),
        warm_again=warm_again,
    )


async def _warm_again(session: aiohttp.ClientSession, comfyui: str, watch: _Watch) -> float | None:
    """ComfyUI told to free its memory (`POST /free` through the gate), then the seconds
    until what FLUX evicted is resident again (None: not within WARM_TIMEOUT)."""
    async with session.post(comfyui + "/free", json={"free_memory": True}) as resp:
        await resp.read()
        if resp.status != 200:
            return None
    freed = time.monotonic()
    try:
        async with asyncio.timeout(WARM_TIMEOUT):
            while True:
                status = await watch.read()
                resident = {r["model"] for r in status["residents"] if r["state"] == "resident"}
                if resident >= WARMED:
                    return time.monotonic() - freed
                await asyncio.sleep(0.05)
    except TimeoutError:
        return None


def _broken(error: str, started: float) -> DemoRun:
    """A run the client could not finish."""
    return DemoRun(0, 0, None, 0, 0, 0, 0, 0, (), 0, time.monotonic() - started, error)


class _Watch:
    """The demo gate's status, read as a client would: its reserve and external use."""

    def __init__(self, session: aiohttp.ClientSession, control: str) -> None:
        self.session = session
        self.control = control
        self.reserve = 0
        self.reserve_max = 0
        self.external_max = 0

    async def read(self) -> dict:
        async with self.session.get(self.control + "/gate/v1/status") as resp:
            status = await resp.json()
        (card,) = status["gpus"]
        self.reserve = card["reserve"]
        self.reserve_max = max(self.reserve_max, self.reserve)
        self.external_max = max(self.external_max, card["external_total"])
        return status

    async def settled(self) -> None:
        """Until the gate has listed what the demo loaded behind its back and its
        whisper-server is up, as it has by the time a reader types the README's commands."""
        async with asyncio.timeout(120):
            while True:
                status = await self.read()
                models = {r["model"] for r in status["residents"]}
                whisper = [c for c in status["consumers"] if c["consumer"] == "whisper"]
                up = bool(whisper) and (whisper[0]["lifecycle"] or {}).get("state") == "up"
                if {"gemma3:12b", "bge-m3:latest"} <= models and up:
                    return
                await asyncio.sleep(0.2)

    async def poll(self) -> None:
        while True:
            with contextlib.suppress(aiohttp.ClientError):
                await self.read()  # a gate gone is the main path's to report
            await asyncio.sleep(0.25)


async def _post(session: aiohttp.ClientSession, url: str, body: bytes) -> int:
    async with session.post(url, data=body) as resp:
        await resp.read()
        return resp.status


async def _post_json(
    session: aiohttp.ClientSession, url: str, body: bytes
) -> tuple[int, dict, str | None]:
    async with session.post(url, data=body) as resp:
        answer = await resp.json(content_type=None)
        return resp.status, answer, resp.headers.get(DEGRADED_HEADER)


async def _rendered(
    session: aiohttp.ClientSession, comfyui: str, prompt_id: str, timeout: float
) -> str | None:
    """The prompt's status_str once ComfyUI's history has it (None: not within timeout)."""
    try:
        async with asyncio.timeout(timeout):
            while True:
                async with session.get(f"{comfyui}/history/{prompt_id}") as resp:
                    entry = (await resp.json()).get(prompt_id)
                if entry is not None:
                    return str(entry["status"]["status_str"])
                await asyncio.sleep(0.5)
    except TimeoutError:
        return None


def counts(runs: Sequence[DemoRun]) -> str:
    """The counts over the runs, as docs/reliability.md gives them."""
    rendered = sum(1 for r in runs if r.rendered == "success")
    refused = sum(r.evicted_then_refused for r in runs)
    at_base = sum(1 for r in runs if r.reserve_max == BASE_RESERVE)
    highest = max((r.reserve_max for r in runs), default=0)
    overruns = sum(r.overruns for r in runs)
    degraded = sum(1 for r in runs if r.degraded and len(r.degraded_events) == 1)
    warm = sorted(r.warm_again for r in runs if r.warm_again is not None)
    within = sum(1 for w in warm if w <= 5.0)
    warm_line = (
        f"; warm again after /free in {len(warm)} of {len(runs)}, within 5 s in {within}"
        + (f" (median {warm[len(warm) // 2]:.2f} s, slowest {warm[-1]:.2f} s)" if warm else "")
    )
    return (
        f"{len(runs)} fresh demos: FLUX rendered {rendered} of {len(runs)}; evictions for a "
        f"demand then refused: {refused}; reserve at its base ({format_gib(BASE_RESERVE)}) "
        f"throughout in {at_base} of {len(runs)} (highest seen {format_gib(highest)}); "
        f"overruns: {overruns}; FLUX degraded, header and event, in {degraded} of {len(runs)}"
        + warm_line
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.e2e.demo_runs")
    parser.add_argument("--runs", type=int, default=50)
    args = parser.parse_args(argv)
    runs = []
    for index in range(args.runs):
        run = asyncio.run(demo_run())
        runs.append(run)
        print(f"{index + 1:3d}  {'ok ' if run.ok else 'BAD'}  {run.line()}", flush=True)
    print(counts(runs), flush=True)
    return 0 if all(run.ok for run in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
