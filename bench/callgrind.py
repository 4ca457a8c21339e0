"""Where a request's instructions go: `gpugate serve` under callgrind (or cProfile).

    python -m bench.callgrind --tool callgrind --out /tmp/gate.cg
    python -m bench.callgrind --tool cprofile --out /tmp/gate.prof
    GPUGATE_LOOP=uvloop python -m bench.callgrind --target passthrough --out /tmp/bare.cg

The gate fronts bench/upstream.py with its model resident, as in `make bench`. A client
sends warm-up requests, then (counted) `--requests` sequential small POSTs on one
keep-alive connection, then (counted separately) `--streams` streams of `--chunks` chunks.
Under callgrind, instrumentation is switched on only for those windows (one dump each);
`callgrind_annotate --inclusive=yes` reads them.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

from bench.targets import free_port, gate_config, wait_http, wait_resident
from gpugate.core.units import GiB
from gpugate.sim.device import SimDevice, SimulatedGpuHost
from gpugate.sim.shim import STATE_ENV, library_path

BODY = {"model": "bench", "prompt": "hi", "stream": False}


async def requests(url: str, count: int) -> None:
    async with aiohttp.ClientSession() as session:
        for _ in range(count):
            async with session.post(url + "/api/generate", json=BODY) as resp:
                assert resp.status == 200
                await resp.read()


async def streams(url: str, count: int, chunks: int) -> None:
    body = {**BODY, "stream": True, "options": {"bench_chunks": chunks, "bench_interval": 0.0}}
    async with aiohttp.ClientSession() as session:
        for _ in range(count):
            async with session.post(url + "/api/generate", json=body) as resp:
                assert resp.status == 200
                async for _line in resp.content:
                    pass


def control(pid: int, *args: str) -> None:
    subprocess.run(["callgrind_control", *args, str(pid)], check=True, capture_output=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tool", choices=("callgrind", "cprofile"), default="callgrind")
    parser.add_argument("--out", required=True)
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--streams", type=int, default=10)
    parser.add_argument("--chunks", type=int, default=100)
    parser.add_argument(
        "--target",
        choices=("gate", "passthrough"),
        default="gate",
        help="what is measured: the gate, or the bare pass-through it is compared with",
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="gpugate-cg-") as tmp:
        upstream_port, port, control_port = free_port(), free_port(), free_port()
        upstream = subprocess.Popen(
            [sys.executable, "-m", "bench.upstream", "--port", str(upstream_port)]
        )
        gpu = SimulatedGpuHost.create(
            Path(tmp) / "gpu", [SimDevice(0, 16 * GiB, 434 * 2**20, "GPU-bench", "bench")]
        )
        config = gate_config(port, control_port, upstream_port, Path(tmp) / "gate.yaml")
        env = {
            **os.environ,
            STATE_ENV: str(gpu.state_path),
            "GPUGATE_NVML_LIBRARY": str(library_path()),
            "GPUGATE_LOG_LEVEL": "WARNING",
        }
        serve = [sys.executable, "-m", "gpugate", "serve", "--config", str(config)]
        if args.target == "passthrough":
            serve = [
                sys.executable, "-m", "bench.passthrough",
                "--port", str(port), "--upstream", f"http://127.0.0.1:{upstream_port}",
            ]  # fmt: skip
            if os.environ.get("GPUGATE_LOOP") == "uvloop":
                serve.append("--uvloop")
        if args.tool == "callgrind":
            serve = [
                "valgrind",
                "--tool=callgrind",
                "--instr-atstart=no",
                f"--callgrind-out-file={args.out}",
                *serve,
            ]
        else:
            serve = [sys.executable, "-m", "cProfile", "-o", args.out, *serve[1:]]
        gate = subprocess.Popen(serve, env=env)
        try:
            if args.target == "gate":
                wait_http(f"http://127.0.0.1:{control_port}/gate/v1/health", timeout=300)
                wait_resident(control_port)
            else:
                wait_http(f"http://127.0.0.1:{port}/api/tags", timeout=300)
            url = f"http://127.0.0.1:{port}"
            asyncio.run(requests(url, 50))
            asyncio.run(streams(url, 2, args.chunks))
            for window in ("requests", "streams"):
                if args.tool == "callgrind":
                    control(gate.pid, "-i", "on")
                start = time.monotonic()
                if window == "requests":
                    asyncio.run(requests(url, args.requests))
                else:
                    asyncio.run(streams(url, args.streams, args.chunks))
                print(window, f"{time.monotonic() - start:.2f}s", flush=True)
                if args.tool == "callgrind":
                    control(gate.pid, "-d", window)
                    control(gate.pid, "-i", "off")
        finally:
            gate.terminate()
            gate.wait(timeout=120)
            upstream.terminate()
            upstream.wait(timeout=30)


if __name__ == "__main__":
    main()
