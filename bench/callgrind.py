"""Where a request's instructions go: `gpugate serve` under callgrind (or cProfile).

    python -m bench.callgrind --tool callgrind --out /tmp/gate.cg
    python -m bench.callgrind --tool cprofile --out /tmp/gate.prof
    python -m bench.callgrind --out /tmp/gate.prof.requests --report 300   # by part
    GPUGATE_LOOP=uvloop python -m bench.callgrind --target passthrough --out /tmp/bare.cg

The gate fronts bench/upstream.py with its model resident, as in `make bench`. A client
sends warm-up requests, then (counted) `--requests` sequential small POSTs on one
keep-alive connection, then (counted separately) `--streams` streams of `--chunks` chunks.
Under callgrind, instrumentation is switched on only for those windows (one dump each);
`callgrind_annotate --inclusive=yes` reads them. Under cProfile, likewise: the gate's
profiler is enabled for each window only (SIGUSR1 on, SIGUSR2 off), and each window is
written as OUT.requests and OUT.streams, which `pstats` reads. cProfile times by the wall
clock; with GPUGATE_PROFILE_TIMER=cpu it counts the thread's CPU time instead, so that a
write is not charged with the time the peer it woke ran on the same core.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

from bench.targets import bench_gpu, free_port, gate_config, gate_env, wait_http, wait_resident

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


PARTS = (
    (
        "forwarding",
        (
            "/gpugate/proxy/forward.py",
            "/gpugate/proxy/http1.py",
            "/gpugate/proxy/http1_response.py",
            "/gpugate/proxy/pool.py",
            "/gpugate/proxy/relay.py",
            "httptools",
        ),
    ),
    ("the listener", ("/gpugate/proxy/",)),
    ("classification", ("/gpugate/runtimes/",)),
    ("admission", ("/gpugate/gate/", "/gpugate/core/")),
    ("metrics", ("/gpugate/control/", "prometheus_client")),
    ("the store", ("/gpugate/store/", "aiosqlite", "sqlite3")),
    ("the event loop", ("/asyncio/", "selectors.py", "uvloop")),
    ("aiohttp's server side", ("/aiohttp/", "multidict", "yarl")),
)
"""How `report` groups a profile's functions, first match wins (by file)."""


def report(path: str, per: int) -> None:
    """A cProfile window's own time by part of the request path, per request (µs) and as
    a share; C calls (`~`) are split into system calls and the rest."""
    import pstats

    parts: dict[str, float] = {}
    stats = pstats.Stats(path).stats  # type: ignore[attr-defined]
    for (filename, _, name), (_, _, own, _, _) in stats.items():
        if filename == "~":
            if "select" in name or "poll" in name:
                part = "waiting (epoll)"  # idle: not the gate's CPU
            elif any(word in name for word in ("send", "recv", "write", "read")):
                part = "system calls"
            else:
                part = "builtins and C calls"
        else:
            part = next(
                (label for label, marks in PARTS if any(m in filename for m in marks)), "other"
            )
        parts[part] = parts.get(part, 0.0) + own
    waiting = parts.pop("waiting (epoll)", 0.0)
    total = sum(parts.values())
    for part, own in sorted(parts.items(), key=lambda item: -item[1]):
        print(f"{part:24s} {own / per * 1e6:8.1f} µs {own / total:6.1%}")
    print(f"{'all but waiting':24s} {total / per * 1e6:8.1f} µs")
    print(f"{'waiting (epoll)':24s} {waiting / per * 1e6:8.1f} µs")


def profiled_serve(out: str, argv: list[str]) -> None:
    """Run `argv` (gpugate's or the pass-through's command line, less the interpreter)
    with cProfile on between SIGUSR1 and SIGUSR2; each window is dumped to OUT.N."""
    import cProfile
    import runpy
    import signal

    windows = iter(("requests", "streams", "more"))
    profiler: list[cProfile.Profile] = []

    def on(signum: int, frame: object) -> None:
        # Wall time by default; GPUGATE_PROFILE_TIMER=cpu counts the thread's CPU time, so
        # that a write's wait while the peer it woke runs is not charged to the writer.
        cpu = os.environ.get("GPUGATE_PROFILE_TIMER") == "cpu"
        profiler[:] = [cProfile.Profile(time.thread_time) if cpu else cProfile.Profile()]
        profiler[0].enable()

    def off(signum: int, frame: object) -> None:
        profiler[0].disable()
        name = f"{out}.{next(windows)}"
        profiler[0].dump_stats(name + ".part")
        os.rename(name + ".part", name)

    signal.signal(signal.SIGUSR1, on)
    signal.signal(signal.SIGUSR2, off)
    sys.argv = argv[1:]
    runpy.run_module(argv[1], run_name="__main__", alter_sys=True)


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
    parser.add_argument("--profiled-serve", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    parser.add_argument(
        "--report", type=int, metavar="N", help="print OUT's own time by part, per N requests"
    )
    args = parser.parse_args()
    if args.report:
        report(args.out, args.report)
        return
    if args.profiled_serve:
        profiled_serve(args.out, args.profiled_serve)
        return
    with tempfile.TemporaryDirectory(prefix="gpugate-cg-") as tmp:
        upstream_port, port, control_port = free_port(), free_port(), free_port()
        upstream = subprocess.Popen(
            [sys.executable, "-m", "bench.upstream", "--port", str(upstream_port)]
        )
        gpu = bench_gpu(Path(tmp) / "gpu")
        config = gate_config(port, control_port, upstream_port, Path(tmp) / "gate.yaml")
        env = gate_env(gpu)
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
            serve = [sys.executable, "-m", "bench.callgrind", "--out", args.out,
                     "--profiled-serve", *serve[1:]]  # fmt: skip
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
            # A window with nothing in it is not opened: its two signals would land together.
            sizes = {"requests": args.requests, "streams": args.streams}
            for window in [name for name, size in sizes.items() if size > 0]:
                if args.tool == "callgrind":
                    control(gate.pid, "-i", "on")
                else:
                    gate.send_signal(signal.SIGUSR1)
                start = time.monotonic()
                if window == "requests":
                    asyncio.run(requests(url, args.requests))
                else:
                    asyncio.run(streams(url, args.streams, args.chunks))
                print(window, f"{time.monotonic() - start:.2f}s", flush=True)
                if args.tool == "callgrind":
                    control(gate.pid, "-d", window)
                    control(gate.pid, "-i", "off")
                else:
                    gate.send_signal(signal.SIGUSR2)
                    # The next window's signal must not land while this one is written.
                    dumped = Path(f"{args.out}.{window}")
                    while not dumped.exists():
                        time.sleep(0.05)
        finally:
            gate.terminate()
            gate.wait(timeout=120)
            upstream.terminate()
            upstream.wait(timeout=30)


if __name__ == "__main__":
    main()
