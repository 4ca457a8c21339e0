"""A swap: from a demand that needs an eviction to its first token, through the gate, next
to the simulated Ollama doing the same swap alone.

    python -m bench.swaps [--rounds N]

Two simulated 10 GiB cards, each with its own simulated Ollama started with
OLLAMA_MAX_LOADED_MODELS=1 (`max_loaded_models: 1`); the gate fronts one of them. Two
models of 6 GiB each, loaded in LOAD_SECONDS (short, so that rounds are quick): A (class
background) is resident, then a streamed generate asks for B (interactive). They do not
fit together: alone, Ollama unloads A and loads B; through the gate, the gate unloads A,
sees its memory back in NVML and its listing no longer naming it, grants B's lease, and
Ollama loads B. Each round does both, in alternating order, after putting A back
(untimed).

Through the gate, the time is split at these moments, read in the same process on one
monotonic clock: the EVICTION_STARTED event (the decision), the adapter's unload call
(sent, answered), the NVML sample that saw the bytes back, the last `/api/ps` listing
(the model no longer listed), the LEASE_GRANTED event, and the first token at the client.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import attrs

from bench.docfile import write_section
from gpugate.core.effects import Event, EventKind
from gpugate.core.residents import ResidentKey
from gpugate.core.units import GiB, MiB
from gpugate.sim.device import SimDevice, SimulatedGpuHost
from gpugate.sim.ollama.server import SimOllama
from gpugate.sim.scenario import OllamaModelSpec, OllamaSpec
from gpugate.sim.shim import STATE_ENV, library_path
from tests.gate.harness import Stack, running_stack

ROUNDS = int(os.environ.get("BENCH_SWAP_ROUNDS", "20"))
LOAD_SECONDS = 0.1
A, B = "llama3.1:8b", "qwen2.5:7b"
MODELS = tuple(
    OllamaModelSpec(name, 6 * GiB, load_seconds=LOAD_SECONDS, tokens_per_second=1000.0)
    for name in (A, B)
)
MODELS_YAML = f"""\
{A}: {{class: background, envelope: 6GiB}}
{B}: {{envelope: 6GiB}}
"""
PHASES = (
    ("decision", "request → eviction decided (read, classify, queue, plan)"),
    ("dispatch", "decided → unload call sent"),
    ("unload", "unload call (Ollama's answer to keep_alive 0)"),
    ("nvml", "answer → NVML shows the bytes back"),
    ("listing", "NVML → /api/ps no longer lists the model"),
    ("grant", "→ eviction done, lease granted"),
    ("load", "grant → first token (forward, Ollama loads B, first token)"),
)


def card(directory: Path) -> SimulatedGpuHost:
    return SimulatedGpuHost.create(
        directory, [SimDevice(0, 10 * GiB, 434 * MiB, f"GPU-{directory.name}", "bench")]
    )


def one_gpu(spec: OllamaSpec) -> OllamaSpec:
    """OLLAMA_MAX_LOADED_MODELS=1, on the card's only GPU."""
    return attrs.evolve(spec, max_loaded_models=1, gpu=0)


async def first_token(session: aiohttp.ClientSession, url: str, model: str) -> float:
    """Seconds from the request to the first streamed line; the stream is read to its end."""
    body = {"model": model, "prompt": "hi", "stream": True, "options": {"num_predict": 2}}
    started = time.monotonic()
    async with session.post(url + "/api/generate", json=body) as resp:
        assert resp.status == 200, await resp.text()
        await resp.content.readline()
        first = time.monotonic()
        await resp.read()
    return first - started


async def generate(session: aiohttp.ClientSession, url: str, model: str, **extra: object) -> None:
    body = {"model": model, "prompt": "hi", "stream": False, **extra}
    async with session.post(url + "/api/generate", json=body) as resp:
        assert resp.status == 200, await resp.text()
        await resp.read()


@attrs.define
class Probe:
    """Timestamps of the gate's parts during one swap (time.monotonic)."""

    calls: list[tuple[str, float, float]] = attrs.field(factory=list)
    events: list[Event] = attrs.field(factory=list)

    def install(self, stack: Stack) -> None:
        runtime = stack.gate.links["ollama"].runtime
        sampler = stack.gate.sampler
        parts = ((runtime.residents, "evict"), (runtime.inventory, "listing"), (sampler, "sample"))
        for owner, name in parts:
            setattr(owner, name, self._timed(name, getattr(owner, name)))
        stack.gate.events.subscribe(self.events.append, routine=True)

    def _timed(self, name: str, call):  # type: ignore[no-untyped-def]
        async def timed(*args, **kwargs):  # type: ignore[no-untyped-def]
            began = time.monotonic()
            try:
                return await call(*args, **kwargs)
            finally:
                self.calls.append((name, began, time.monotonic()))

        return timed

    def clear(self) -> None:
        self.calls.clear()
        self.events.clear()

    def phases(self, sent: float, first: float) -> dict[str, float]:
        """Milliseconds spent in each of PHASES, and what was called on the way."""

        def event(kind: EventKind, model: str) -> float:
            return next(e.time for e in self.events if e.kind is kind and e.model == model)

        decided = event(EventKind.EVICTION_STARTED, A)
        done = event(EventKind.EVICTION_DONE, A)
        granted = event(EventKind.LEASE_GRANTED, B)
        (evict,) = [(b, e) for name, b, e in self.calls if name == "evict"]
        within = [(n, b, e) for n, b, e in self.calls if evict[1] <= b and e <= done]
        samples = [e for n, _, e in within if n == "sample"]
        listings = [e for n, _, e in within if n == "listing"]
        confirmed = samples[-1] if samples else evict[1]
        unlisted = listings[-1] if listings else confirmed
        marks = (sent, decided, evict[0], evict[1], confirmed, unlisted, granted, first)
        result = {name: (marks[i + 1] - marks[i]) * 1000 for i, (name, _) in enumerate(PHASES)}
        result["samples"] = float(len(samples))
        result["listings"] = float(len(listings))
        result["listings_before"] = float(
            sum(1 for n, b, _ in self.calls if n == "listing" and sent <= b < decided)
        )
        return result


async def reset_gated(stack: Stack, session: aiohttp.ClientSession) -> None:
    """B gone and A resident again, through the gate (untimed)."""
    key = ResidentKey("ollama", B)
    if stack.gate.core.resident(key) is not None:
        done = stack.next_event(EventKind.EVICTION_DONE, key=key)
        stack.gate.evict(key, force=True)
        await asyncio.wait_for(done, 30)
    await generate(session, stack.gate_url, A)


async def reset_direct(url: str, session: aiohttp.ClientSession) -> None:
    await generate(session, url, B, keep_alive=0)
    await generate(session, url, A)


async def rounds(tmp: Path, count: int) -> dict[str, object]:
    gated_host, direct_host = card(tmp / "gated"), card(tmp / "direct")
    os.environ[STATE_ENV] = str(gated_host.state_path)
    direct_sim = SimOllama(
        one_gpu(OllamaSpec(listen="127.0.0.1:0", keep_alive="5m", models=MODELS)), direct_host
    )
    direct_url = await direct_sim.start()
    direct: list[float] = []
    gated: list[float] = []
    phases: list[dict[str, float]] = []
    probe = Probe()
    try:
        async with (
            running_stack(
                tmp, gated_host, library_path(), models=MODELS, models_yaml=MODELS_YAML,
                spec=one_gpu,
            ) as stack,
            aiohttp.ClientSession() as session,
        ):  # fmt: skip
            probe.install(stack)
            for i in range(count):
                await reset_gated(stack, session)
                await reset_direct(direct_url, session)
                # Which goes first alternates: a drift of the machine falls on both.
                if i % 2 == 0:
                    direct.append(await first_token(session, direct_url, B))
                probe.clear()
                sent = time.monotonic()
                gated.append(await first_token(session, stack.gate_url, B))
                phases.append(probe.phases(sent, sent + gated[-1]))
                if i % 2 == 1:
                    direct.append(await first_token(session, direct_url, B))
    finally:
        await direct_sim.close()
    added = [(g - d) * 1000 for g, d in zip(gated, direct, strict=True)]
    return {
        "rounds": count,
        "direct_ms": statistics.median(direct) * 1000,
        "gate_ms": statistics.median(gated) * 1000,
        "added_ms": statistics.median(added),
        "phases_ms": {key: statistics.median(p[key] for p in phases) for key in phases[0]},
    }


def measure(count: int = ROUNDS) -> dict[str, object]:
    """Run the rounds on simulated cards of their own, on every core (a load starts a
    runner process, which pinned beside everything else would wait for the CPU)."""
    pinned = os.sched_getaffinity(0)
    os.sched_setaffinity(0, range(os.cpu_count() or 1))
    try:
        with tempfile.TemporaryDirectory(prefix="gpugate-swaps-") as tmp:
            return asyncio.run(rounds(Path(tmp), count))
    finally:
        os.sched_setaffinity(0, pinned)


def measure_apart(count: int = ROUNDS) -> dict[str, object]:
    """`measure` in a new Python process, as for bench/coldstart.py."""
    done = subprocess.run(
        [sys.executable, "-m", "bench.swaps", "--rounds", str(count)],
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(done.stdout.splitlines()[0])


def table(result: dict[str, object]) -> list[str]:
    """The section's lines for docs/benchmarks.md."""
    phases = result["phases_ms"]
    lines = [
        "",
        f"Measured {time.strftime('%Y-%m-%d')}. "
        f"A swap on a simulated 10 GiB card: model A (6 GiB, background) resident, a "
        f"streamed generate for B (6 GiB) that cannot fit beside it, from the request to "
        f"B's first token; the simulated Ollama with OLLAMA_MAX_LOADED_MODELS=1 alone, and "
        f"through the gate; both loads take {LOAD_SECONDS * 1000:.0f} ms (short on "
        f"purpose); the median of {result['rounds']} rounds, each doing both in alternating "
        f"order; added: the median of the rounds' differences:",
        "",
        "| path | request → first token ms | added ms |",
        "|---|---:|---:|",
        f"| Ollama alone (swaps itself) | {result['direct_ms']:.1f} | — |",
        f"| gpugate (evicts, confirms, grants) | {result['gate_ms']:.1f} | "
        f"{result['added_ms']:+.1f} |",
        "",
        f"Through the gate, where it goes (median per phase; during the eviction NVML was "
        f"sampled {phases['samples']:.0f} and `/api/ps` listed {phases['listings']:.0f} "  # type: ignore[index]
        f"time(s) at the median, and listed {phases['listings_before']:.0f} time(s) "  # type: ignore[index]
        f"before the decision):",
        "",
        "| phase | ms |",
        "|---|---:|",
    ]
    for key, label in PHASES:
        lines.append(f"| {label} | {phases[key]:.1f} |")  # type: ignore[index]
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    parser.add_argument("--write", action="store_true", help="update docs/benchmarks.md")
    args = parser.parse_args()
    result = measure(args.rounds)
    print(json.dumps(result))
    print("\n".join(table(result)))
    if args.write:
        write_section("swaps", "\n".join(table(result)))


if __name__ == "__main__":
    main()
