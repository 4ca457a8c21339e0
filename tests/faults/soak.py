"""Soak the gate: `python -m tests.faults.soak --requests N --seed S`.

A seeded mixed workload through `gpugate serve` on the simulated host (tests.faults.stack):
every class through identities and X-GPUGate-Priority, streaming and not, clients that
leave mid-stream, the Plex transcode growing and shrinking through the sim host's state,
evictions. Meanwhile /gate/v1/status is sampled and checked:

* committed + external + reserve (+ driver reserved) stays within the card, except when
  external use alone pushed it there (committed did not grow into it);
* no lease outlives its request: leases never outnumber the requests in flight;
* every request is answered (a status, or the client chose to leave).

Prints figures; exits 1 when a check fails.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import random
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import aiohttp
import attrs

from gpugate.core.units import GiB, MiB
from gpugate_sim.device import GpuOutOfMemory
from tests.faults.stack import CAPACITY_CLASSES, MODELS, Stack, eventually, stack

CONCURRENCY = 12
IDENTITIES = "  - {name: ops, tokens: [ops-token], class: production}\n"


@attrs.define
class Soak:
    s: Stack
    rng: random.Random
    requests: int
    outcomes: Counter[str] = attrs.field(factory=Counter)
    problems: list[str] = attrs.field(factory=list)
    in_flight: int = 0
    samples: int = 0
    over_by_external: int = 0
    peak_leases: int = 0
    peak_external: int = 0
    started: float = 0.0
    plex_refused: int = 0
    plex_pid: int = 0

    def request(self) -> tuple[str, dict, dict, bool, bool]:
        rng = self.rng
        model = rng.choice(list(MODELS))
        headers: dict[str, str] = {}
        roll = rng.random()
        if roll < 0.1:
            headers["Authorization"] = "Bearer ops-token"
        elif roll < 0.4:
            headers["X-GPUGate-Priority"] = rng.choice(["background", "benchmark", "production"])
        if model == "bge-m3":
            return "/api/embed", {"model": model, "input": ["a", "b"]}, headers, False, False
        stream = rng.random() < 0.5
        leave = stream and rng.random() < 0.1
        options = {"num_predict": rng.randint(1, 20)}
        if rng.random() < 0.6:
            body = {"model": model, "prompt": "q", "stream": stream, "options": options}
            if rng.random() < 0.3:
                body["keep_alive"] = rng.choice(["5m", -1, "30s", 0, 3600, "24h"])
            return "/api/generate", body, headers, stream, leave
        body = {
            "model": model,
            "stream": stream,
            "max_tokens": options["num_predict"],
            "messages": [{"role": "user", "content": "hi"}],
        }
        return "/v1/chat/completions", body, headers, stream, leave

    async def one(self, session: aiohttp.ClientSession) -> None:
        path, body, headers, _, leave = self.request()
        self.in_flight += 1
        try:
            async with session.post(self.s.url + path, json=body, headers=headers) as resp:
                failure = resp.headers.get("X-GPUGate-Failure")
                if resp.status == 200 and leave:
                    await resp.content.readany()
                    self.outcomes["left mid-stream"] += 1
                    resp.close()
                    return
                await resp.read()
                if resp.status == 200:
                    self.outcomes["ok"] += 1
                elif resp.status == 503 and failure in CAPACITY_CLASSES:
                    self.outcomes[failure] += 1
                else:
                    self.outcomes[f"{resp.status} {failure}"] += 1
                    self.problems.append(f"{path} {body.get('model')}: {resp.status} {failure}")
        except (aiohttp.ClientError, TimeoutError) as exc:
            self.outcomes["unanswered"] += 1
            self.problems.append(f"{path} {body.get('model')}: unanswered: {exc!r}")
        finally:
            self.in_flight -= 1

    async def workload(self) -> None:
        remaining = iter(range(self.requests))
        timeout = aiohttp.ClientTimeout(total=60)
        async with aiohttp.ClientSession(timeout=timeout) as session:

            async def worker() -> None:
                for _ in remaining:
                    await self.one(session)

            await asyncio.gather(*(worker() for _ in range(CONCURRENCY)))

    async def pressure(self, stop: asyncio.Event) -> None:
        """Plex grows and shrinks by up to 4 GiB, as transcodes start and end."""
        rows = self.s.host.gpu.read().processes
        plex = self.plex_pid = next(p for p in rows if p.name.startswith("Plex")).pid
        extra = 0
        while not stop.is_set():
            target = self.rng.choice([0, 0, 1, 2, 4]) * GiB
            # Only growth that fits: a refused one would be recorded as an OOM of the card.
            if target > extra and self.s.host.gpu.free() - (target - extra) > 256 * MiB:
                try:
                    self.s.host.gpu.allocate(plex, target - extra)
                    extra = target
                except GpuOutOfMemory:  # a load took the room in between, as it may
                    self.plex_refused += 1
            elif target > extra:
                self.plex_refused += 1
            elif target < extra:
                self.s.host.gpu.release(plex, extra - target)
                extra = target
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.rng.uniform(1.0, 4.0))

    async def watch(self, stop: asyncio.Event) -> None:
        previous: dict | None = None
        previous_in_flight = 0
        async with aiohttp.ClientSession() as session:
            while not stop.is_set():
                in_flight_before = self.in_flight
                async with session.get(self.s.gate.control + "/gate/v1/status") as resp:
                    document = await resp.json()
                self.samples += 1
                gpu = document["gpus"][0]
                leases = len(document["leases"])
                self.peak_leases = max(self.peak_leases, leases)
                self.peak_external = max(self.peak_external, gpu["external_total"])
                over = used(gpu) - gpu["total"]
                if over > 0:
                    grew = (
                        previous is not None
                        and gpu["committed_total"] > previous["committed_total"]
                    )
                    if grew:
                        self.problems.append(f"over the card by {over} while committed grew: {gpu}")
                    else:
                        self.over_by_external += 1
                allowed = max(in_flight_before, self.in_flight, previous_in_flight)
                if leases > allowed:
                    self.problems.append(f"{leases} leases with {allowed} requests in flight")
                previous, previous_in_flight = gpu, self.in_flight
                await asyncio.sleep(0.1)

    def figures(self) -> str:
        seconds = time.monotonic() - self.started
        rows = [
            ("requests", str(self.requests)),
            ("seconds", f"{seconds:.1f}"),
            ("requests/s", f"{self.requests / seconds:.1f}"),
            *((f"  {k}", str(v)) for k, v in sorted(self.outcomes.items())),
            ("status samples", str(self.samples)),
            ("samples over the card by external growth", str(self.over_by_external)),
            ("peak leases", str(self.peak_leases)),
            ("peak external", f"{self.peak_external / GiB:.2f} GiB"),
            ("Plex growth that did not fit", str(self.plex_refused)),
            ("OOMs of managed loads", str(len(self.ooms()))),
            ("problems", str(len(self.problems))),
        ]
        width = max(len(k) for k, _ in rows)
        return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)

    def ooms(self) -> list:
        """OOMs on the simulated card, without Plex's own refused growth."""
        return [e for e in self.s.host.gpu.ooms() if e.pid != self.plex_pid]


def used(gpu: dict) -> int:
    return gpu["committed_total"] + gpu["external_total"] + gpu["reserve"] + gpu["driver_reserved"]


async def run(requests: int, seed: int, directory: Path) -> Soak:
    """Start the stack, run the workload with the pressure and the watcher, check the end."""
    gate = {"ttl": "10s", "budget": "identities:\n" + IDENTITIES}
    async with stack(directory, gate=gate) as s:
        soak = Soak(s, random.Random(seed), requests, started=time.monotonic())
        stop = asyncio.Event()
        side = [asyncio.create_task(soak.pressure(stop)), asyncio.create_task(soak.watch(stop))]
        try:
            await soak.workload()
        finally:
            stop.set()
            await asyncio.gather(*side)
        answered = sum(soak.outcomes.values())
        if answered != requests:
            soak.problems.append(f"{answered} of {requests} requests answered")
        try:
            await eventually(s.gate.status, lambda d: d["leases"] == [] and d["queue"] == [], 20)
        except AssertionError as exc:
            soak.problems.append(f"left at the end: {exc}")
        if soak.ooms():
            soak.problems.append(f"OOMs: {soak.ooms()[:3]}")
        print(soak.figures())
    return soak


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.faults.soak", description=__doc__)
    parser.add_argument("--requests", type=int, default=10_000)
    parser.add_argument("--seed", type=int, default=20261202)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="gpugate-soak-") as directory:
        soak = asyncio.run(run(args.requests, args.seed, Path(directory)))
    for problem in soak.problems[:30]:
        print("FAIL", problem)
    return 1 if soak.problems else 0


if __name__ == "__main__":
    sys.exit(main())
