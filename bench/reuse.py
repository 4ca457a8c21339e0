"""What reusing a connection to each runtime's server is worth: the gate's own upstream
client (proxy/pool.py) against the real llama-server and whisper-server and their
simulators, `GET /health` one at a time, under three policies taking turns request by
request: a new connection per request (`Connection: close`), a reused one, and a reused
one whose socket ACKs at once (TCP_QUICKACK after each request, `KeepAlivePolicy.nagle`).

    python -m bench.reuse [--requests N]

A policy pays where it is the fastest: this is what keepalive.py's choices per runtime
rest on (whisper-server leaves Nagle on, so a reused connection waits 40 ms for the
delayed ACK unless it ACKs at once).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from bench.docfile import write_section
from bench.real_rig import llama_argv, whisper_argv
from bench.targets import LOAD_CPU, PROXY_CPU, start, wait_http
from gpugate.config.model import UpstreamTimeouts
from gpugate.core.units import GiB
from gpugate.proxy.pool import UpstreamPool
from gpugate.runtimes.keepalive import KEEP, NEVER, KeepAlivePolicy
from gpugate_sim.device import SimDevice, SimulatedGpuHost
from tests.gate.harness import free_ports
from tests.llamaserver.gguf_models import write_tiny_llama
from tests.whisper.ggml_models import write_english

REQUESTS = int(os.environ.get("BENCH_REUSE_REQUESTS", "300"))
BOUNDS = UpstreamTimeouts(connect=30.0, first_byte=30.0, idle=30.0)
HEALTH = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
CLOSE = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
POLICIES: dict[str, tuple[KeepAlivePolicy, bytes]] = {
    "new connection": (NEVER, CLOSE),
    "reused": (KEEP, HEALTH),
    "reused, ACK at once": (KeepAlivePolicy(nagle=True), HEALTH),
}
SERVERS = ("llama-server (real)", "llama-server (sim)", "whisper-server (real)",
           "whisper-server (sim)")  # fmt: skip


@contextlib.contextmanager
def servers(tmp: Path) -> Iterator[dict[str, int]]:
    """The four servers on the load generator's core, each `GET /health` answering."""
    llama = write_tiny_llama(tmp / "tiny.gguf", seed=11)
    whisper = write_english(tmp / "ggml-tiny.en.bin", seed=1)
    gpu = tmp / "gpu"
    SimulatedGpuHost.create(gpu, [SimDevice(0, 16 * GiB, 0, "GPU-reuse", "sim")])
    ports = dict(zip(SERVERS, free_ports(len(SERVERS)), strict=True))
    sim = [sys.executable, "-m"]
    argv = {
        "llama-server (real)": llama_argv(llama, ports["llama-server (real)"]),
        "llama-server (sim)": [*sim, "gpugate_sim.llamaserver",
                               *llama_argv(llama, ports["llama-server (sim)"])[1:]],
        "whisper-server (real)": whisper_argv(whisper, ports["whisper-server (real)"]),
        "whisper-server (sim)": [*sim, "gpugate_sim.whisper", "--sim-state-dir", str(gpu),
                                 *whisper_argv(whisper, ports["whisper-server (sim)"])[1:]],
    }  # fmt: skip
    env = {**os.environ, "LLAMA_CACHE": str(tmp / "llama-cache")}
    processes = [start(command, LOAD_CPU, env, tmp / f"{i}.log") for i, command in
                 enumerate(argv.values())]  # fmt: skip
    try:
        for port in ports.values():
            wait_http(f"http://127.0.0.1:{port}/health", timeout=60)
        yield ports
    finally:
        for process in processes:
            process.terminate()
        for process in processes:
            process.wait(timeout=30)


async def one(pool: UpstreamPool, head: bytes) -> float:
    began = time.perf_counter()
    response = await pool.send(head, None, BOUNDS)
    body = await response.read(1 << 16, BOUNDS.idle)
    response.release()
    if response.status != 200 or b"ok" not in body:
        raise RuntimeError(f"GET /health: {response.status} {body!r}")
    return (time.perf_counter() - began) * 1e6


async def measure_server(port: int, requests: int) -> dict[str, float]:
    """Median µs per policy, the policies taking turns request by request."""
    pools = {name: UpstreamPool("127.0.0.1", port, keep_alive=p) for name, (p, _) in
             POLICIES.items()}  # fmt: skip
    samples: dict[str, list[float]] = {name: [] for name in POLICIES}
    try:
        for name, (_, head) in POLICIES.items():
            await one(pools[name], head)  # warm
        for i in range(requests):
            names = list(POLICIES)
            for k in range(len(names)):
                name = names[(i + k) % len(names)]
                samples[name].append(await one(pools[name], POLICIES[name][1]))
    finally:
        for pool in pools.values():
            pool.close()
    return {name: statistics.median(values) for name, values in samples.items()}


def measure(requests: int = REQUESTS) -> dict[str, dict[str, float]]:
    """Every server, every policy; the client (the gate's code) on the proxy's core."""
    pinned = os.sched_getaffinity(0)
    try:
        with (
            tempfile.TemporaryDirectory(prefix="gpugate-reuse-") as tmp,
            servers(Path(tmp)) as ports,
        ):
            os.sched_setaffinity(0, {PROXY_CPU})
            return {name: asyncio.run(measure_server(port, requests)) for name, port in
                    ports.items()}  # fmt: skip
    finally:
        os.sched_setaffinity(0, pinned)


def measure_apart(requests: int = REQUESTS) -> dict[str, dict[str, float]]:
    """`measure` in a new Python process, its results through a file."""
    with tempfile.NamedTemporaryFile(prefix="gpugate-reuse-", suffix=".json") as out:
        done = subprocess.run(
            [sys.executable, "-m", "bench.reuse", "--requests", str(requests), "--json",
             out.name],
            capture_output=True,
            text=True,
        )  # fmt: skip
        if done.returncode != 0:
            tail = "\n".join((done.stdout + done.stderr).splitlines()[-40:])
            raise RuntimeError(f"bench.reuse failed ({done.returncode}):\n{tail}")
        return json.loads(Path(out.name).read_text())


def table(results: dict[str, dict[str, float]], requests: int) -> list[str]:
    """The section's lines for docs/benchmarks.md."""
    names = list(POLICIES)
    lines = [
        "",
        f"Measured {time.strftime('%Y-%m-%d')}. The gate's upstream client, `GET /health` "
        f"one at a time, {requests} per policy, the policies taking turns (bench/reuse.py); "
        "µs, medians:",
        "",
        "| server | " + " | ".join(names) + " | fastest |",
        "|---|" + "---:|" * len(names) + "---|",
    ]
    for server, row in results.items():
        best = min(row, key=row.__getitem__)
        lines.append(f"| {server} | " + " | ".join(f"{row[n]:.0f}" for n in names) + f" | {best} |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=REQUESTS)
    parser.add_argument("--json", help="write the results here as JSON")
    parser.add_argument("--write", action="store_true", help="update docs/benchmarks.md")
    args = parser.parse_args()
    results = measure(args.requests)
    if args.json:
        Path(args.json).write_text(json.dumps(results))
    print("\n".join(table(results, args.requests)))
    if args.write:
        write_section("reuse", "\n".join(table(results, args.requests)))


if __name__ == "__main__":
    main()
