"""A whisper-server cold start through the gate, next to the same cold start done directly.

    python -m bench.coldstart [--rounds N]

Direct: the client starts the simulated whisper-server itself, connects as soon as its port
accepts (polled every millisecond) and sends one transcription; the time is from the spawn
to the answer. Through the gate: whisper is stopped, the transcription goes to the gate,
which takes the start lease, starts the same command, waits for its port and /health and
forwards; the time is from the request to the answer. Each round does both, in alternating
order, and the gate's whisper is stopped (evicted) after its start; what the gate adds (its
lease, its readiness polling and one more hop) is the median of the rounds' differences.
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

from gpugate.core.effects import EventKind
from gpugate.core.residents import ResidentKey
from gpugate.core.units import GiB, MiB
from gpugate_sim.device import SimDevice, SimulatedGpuHost
from gpugate_sim.serverprocess import child_env
from gpugate_sim.shim import STATE_ENV, library_path
from gpugate_sim.whisper import WhisperServerSpec, whisper_argv
from tests.gate.harness import free_ports, running_stack
from tests.gate.test_process_start import KEEP_WARM, TURBO, wav_bytes, whisper_yaml

LOAD_SECONDS = 0.5
"""The simulated model load (the demo's), the same on both paths."""


@attrs.frozen
class ColdStart:
    """Medians of both paths, and of what each round's gate start took beyond the direct
    start beside it, in milliseconds."""

    direct_ms: float
    gate_ms: float
    rounds: int
    added_ms: float
    """Median of the rounds' differences (gate − direct): a slow moment of the machine
    falls on both starts of a round, and a difference of medians would keep it."""
    added_low_ms: float
    added_high_ms: float
    """The differences' quartiles: how far one round's answer can be from the median."""


def spec(port: int) -> WhisperServerSpec:
    return WhisperServerSpec(
        listen=f"127.0.0.1:{port}",
        model=TURBO,
        models={TURBO: 2050 * MiB},
        load_seconds=LOAD_SECONDS,
        keepalive_timeout=5.0,
    )


async def transcribe(session: aiohttp.ClientSession, url: str) -> None:
    form = aiohttp.FormData()
    form.add_field("file", wav_bytes(0.2), filename="a.wav", content_type="audio/wav")
    async with session.post(url + "/inference", data=form) as resp:
        body = await resp.read()
        assert resp.status == 200, body


async def direct_round(session: aiohttp.ClientSession, directory: Path, port: int) -> float:
    argv = whisper_argv(spec(port), directory)
    env = {**os.environ, **child_env({})}
    started = time.monotonic()
    process = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, start_new_session=True)
    try:
        while True:
            try:
                _, writer = await asyncio.open_connection("127.0.0.1", port)
                writer.close()
                break
            except OSError:
                await asyncio.sleep(0.001)
        await transcribe(session, f"http://127.0.0.1:{port}")
        return time.monotonic() - started
    finally:
        process.terminate()
        await asyncio.to_thread(process.wait)


async def rounds(tmp: Path, count: int) -> ColdStart:
    host = SimulatedGpuHost.create(
        tmp / "gpu", [SimDevice(0, 16 * GiB, 434 * MiB, "GPU-coldstart", "bench")]
    )
    os.environ[STATE_ENV] = str(host.state_path)
    listen, upstream, direct_port = free_ports(3)
    argv = whisper_argv(spec(upstream), host.directory)
    extra = whisper_yaml(listen, upstream, argv, residency=KEEP_WARM, cls="background")
    direct: list[float] = []
    through: list[float] = []
    key = ResidentKey("whisper", TURBO)
    async with (
        running_stack(tmp, host, library_path(), extra=extra) as stack,
        aiohttp.ClientSession() as session,
    ):
        for i in range(count):
            # Which path goes first alternates: a drift of the machine's speed within a
            # round counts against each path in turn.
            first_direct = i % 2 == 0
            if first_direct:
                direct.append(await direct_round(session, host.directory, direct_port))
            started = time.monotonic()
            await transcribe(session, f"http://127.0.0.1:{listen}")
            through.append(time.monotonic() - started)
            done = stack.next_event(EventKind.EVICTION_DONE, key=key)
            stack.gate.evict(key, force=True)
            await done
            if not first_direct:
                direct.append(await direct_round(session, host.directory, direct_port))
    added = [(g - d) * 1000 for g, d in zip(through, direct, strict=True)]
    low, _, high = statistics.quantiles(added, n=4) if len(added) > 1 else (added * 3)
    return ColdStart(
        statistics.median(direct) * 1000,
        statistics.median(through) * 1000,
        count,
        statistics.median(added),
        low,
        high,
    )


def measure(rounds_count: int = 15) -> ColdStart:
    """Run the rounds on a simulated card of their own, on every core (a start is a new
    process importing its modules: pinned beside the gate it would wait for the gate's CPU,
    which is not what a host with a gate on it sees)."""
    pinned = os.sched_getaffinity(0)
    os.sched_setaffinity(0, range(os.cpu_count() or 1))
    try:
        with tempfile.TemporaryDirectory(prefix="gpugate-coldstart-") as tmp:
            return asyncio.run(rounds(Path(tmp), rounds_count))
    finally:
        os.sched_setaffinity(0, pinned)


def measure_apart(rounds_count: int = 15) -> ColdStart:
    """`measure` in a new Python process, as a gate on a host runs: not inside a process
    that ran other benchmarks (their heap, threads and file descriptors)."""
    done = subprocess.run(
        [sys.executable, "-m", "bench.coldstart", "--rounds", str(rounds_count)],
        capture_output=True,
        text=True,
        check=True,
    )
    return ColdStart(**json.loads(done.stdout.splitlines()[0]))


def table(result: ColdStart) -> list[str]:
    return [
        "",
        f"whisper-server cold start (simulated, a {LOAD_SECONDS:g} s model load), from the "
        f"spawn or the request to the first transcription's answer, median of "
        f"{result.rounds} rounds, each a direct start and a start through the gate in "
        f"alternating order; added: the median of the rounds' differences, with their "
        f"quartiles (target: at most +100 ms through the gate):",
        "",
        "| path | cold start ms | added ms (median) | added ms (quartiles) |",
        "|---|---:|---:|---:|",
        f"| direct | {result.direct_ms:.1f} | — | — |",
        f"| gpugate | {result.gate_ms:.1f} | {result.added_ms:+.1f} | "
        f"{result.added_low_ms:+.1f} … {result.added_high_ms:+.1f} |",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    result = measure(parser.parse_args().rounds)
    print(json.dumps(attrs.asdict(result)))
    print("\n".join(table(result)))


if __name__ == "__main__":
    main()
