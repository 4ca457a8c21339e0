"""What holds the gate's event loop: every callback that ran longer than a threshold.

    python -m bench.stalls                   # the gate, 16 connections of wrk for 6 s
    python -m bench.stalls --connections 64 --threshold 0.5
    python -m bench.stalls --streams 64      # bench/streams.py's 64 streams instead of wrk
    STALLS_GC_THRESHOLDS=700,10,10 python -m bench.stalls --streams 1000

The gate fronts bench/upstream.py with its model resident, as in `make bench`, and runs
with `asyncio.events.Handle._run` timed: a callback (a task's step, a protocol's
`data_received`, a timer) that takes longer than `--threshold` ms is counted under its
name, with the longest time and the sum; each generation's garbage collections likewise.
A worker thread that holds the GIL shows up here too, as the loop's callback that was
running when it took the GIL. The report is printed when the gate stops. It names where
the p99 of `make bench` comes from; it is not part of `make bench` (timing every callback
costs the gate about 10 % of its rate).
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.targets import (
    LOAD_CPU,
    PROXY_CPU,
    ROOT,
    WRK,
    WRK_LIB,
    bench_gpu,
    free_port,
    gate_config,
    gate_env,
    start,
    wait_http,
    wait_resident,
)


def add(row: list[float], spent: float) -> None:
    """One more occurrence in a [count, total, longest] row."""
    row[0] += 1
    row[1] += spent
    row[2] = max(row[2], spent)


def traced_serve(config: str, threshold_ms: float) -> None:
    """`gpugate serve --config CONFIG` with every loop callback timed (in the gate's process)."""
    import asyncio.events
    import atexit
    import collections

    slow: dict[str, list[float]] = collections.defaultdict(lambda: [0, 0.0, 0.0])
    limit = threshold_ms / 1000.0
    plain = asyncio.events.Handle._run
    clock = time.perf_counter

    def name_of(handle: asyncio.events.Handle) -> str:
        callback = handle._callback
        owner = getattr(callback, "__self__", None)
        if owner is not None and hasattr(owner, "get_coro"):  # a task's step
            coro = owner.get_coro()
            frame = getattr(coro, "cr_frame", None)
            code = getattr(coro, "cr_code", None)
            where = (
                f"{code.co_filename.rsplit('/', 2)[-1]}:{frame.f_lineno}" if frame and code else ""
            )
            return f"task {getattr(coro, '__qualname__', coro)} {where}"
        text = repr(callback)
        return re.sub(r" at 0x[0-9a-f]+", "", text)[:160]

    def timed(self: asyncio.events.Handle) -> None:
        began = clock()
        plain(self)
        spent = clock() - began
        if spent > limit:
            add(slow[name_of(self)], spent)

    asyncio.events.Handle._run = timed  # type: ignore[method-assign]

    # Garbage collections, by generation: count, total and longest time.
    import gc

    collections_by_gen: dict[int, list[float]] = collections.defaultdict(lambda: [0, 0.0, 0.0])
    began_gc = [0.0]

    def on_gc(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            began_gc[0] = clock()
            return
        add(collections_by_gen[info["generation"]], clock() - began_gc[0])

    gc.callbacks.append(on_gc)
    if os.environ.get("STALLS_GC_THRESHOLDS"):  # to try others than serve.py's
        import gpugate.serve

        wanted = tuple(map(int, os.environ["STALLS_GC_THRESHOLDS"].split(",")))
        gpugate.serve.GC_THRESHOLDS = wanted  # type: ignore[assignment]

    def report() -> None:
        for gen, (count, total, longest) in sorted(collections_by_gen.items()):
            print(
                f"gc generation {gen}: {int(count)} collections, {total * 1000:.1f} ms in all, "
                f"longest {longest * 1000:.2f} ms",
                file=sys.stderr,
            )
        rows = sorted(slow.items(), key=lambda item: -item[1][1])
        print(
            f"callbacks over {threshold_ms:g} ms: count, total ms, longest ms, what",
            file=sys.stderr,
        )
        for what, (count, total, longest) in rows[:30]:
            print(
                f"{int(count):7d} {total * 1000:9.1f} {longest * 1000:8.2f}  {what}",
                file=sys.stderr,
            )

    atexit.register(report)
    from gpugate.cli import main

    sys.argv = ["gpugate", "serve", "--config", config]
    try:
        main()
    finally:
        report()
        atexit.unregister(report)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--connections", type=int, default=16)
    parser.add_argument("--seconds", type=int, default=6)
    parser.add_argument("--threshold", type=float, default=1.0, help="ms")
    parser.add_argument("--streams", type=int, help="run this many streams instead of wrk")
    parser.add_argument("--serve", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        traced_serve(args.serve, args.threshold)
        return
    with tempfile.TemporaryDirectory(prefix="gpugate-stalls-") as tmp:
        upstream_port, port, control_port = free_port(), free_port(), free_port()
        upstream = start(
            [sys.executable, "-m", "bench.upstream", "--port", str(upstream_port)], LOAD_CPU
        )
        gpu = bench_gpu(Path(tmp) / "gpu")
        config = gate_config(port, control_port, upstream_port, Path(tmp) / "gate.yaml")
        # The timing hook is asyncio's Handle: uvloop's callbacks run in C.
        env = gate_env(gpu, GPUGATE_LOOP="asyncio")
        argv = [sys.executable, "-m", "bench.stalls", "--threshold", str(args.threshold)]
        gate = start([*argv, "--serve", str(config)], PROXY_CPU, env, Path(tmp) / "gate.log")
        try:
            wait_http(f"http://127.0.0.1:{control_port}/gate/v1/health")
            wait_resident(control_port)
            os.sched_setaffinity(0, {LOAD_CPU})
            url = f"http://127.0.0.1:{port}"
            if args.streams:
                argv = [sys.executable, "-m", "bench.streams", "--url", url]
                argv += ["--streams", str(args.streams)]
                if args.streams > 64:  # as bench/holds.py holds them
                    argv += ["--chunks", "10", "--interval", "0.5"]
                out = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
            else:
                out = subprocess.run(
                    [
                        str(WRK), "-t1", f"-c{args.connections}", f"-d{args.seconds}s",
                        "--latency", "-s", str(ROOT / "bench" / "post.lua"), url + "/api/generate",
                    ],
                    env={**os.environ, "LD_LIBRARY_PATH": str(WRK_LIB)},
                    capture_output=True, text=True, check=True,
                ).stdout  # fmt: skip
            print(out)
        finally:
            gate.send_signal(signal.SIGTERM)
            gate.wait(timeout=60)
            upstream.terminate()
            upstream.wait(timeout=30)
            print((Path(tmp) / "gate.log").read_text())


if __name__ == "__main__":
    main()
