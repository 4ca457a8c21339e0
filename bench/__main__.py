"""`make bench`: the gate against a direct connection, a bare aiohttp pass-through and nginx.

Everything runs on this machine at once (bench/targets.py starts it). The proxy under
test gets a core of its own; the load generator and the upstream share the other (on a
machine with one core, all share it). Targets are measured in interleaved rounds and the
median kept, so a burst of noise does not land on one of them only. Only ratios measured
in the same run mean anything. Results are printed and written into docs/benchmarks.md
between its markers.
"""

from __future__ import annotations

import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.alternation import measure as measure_alternation
from bench.alternation import table as alternation_table
from bench.coldstart import ColdStart
from bench.coldstart import measure_apart as measure_coldstart_apart
from bench.coldstart import table as coldstart_table
from bench.decisions import measure as measure_decisions
from bench.decisions import table as decisions_table
from bench.docfile import write_section
from bench.goals import goals
from bench.goals import table as goals_table
from bench.holds import Results as HoldResults
from bench.holds import measure as measure_holds
from bench.holds import tables as holds_tables
from bench.real import measure_apart as measure_real_apart
from bench.real import table as real_table
from bench.reuse import REQUESTS as REUSE_REQUESTS
from bench.reuse import measure_apart as measure_reuse_apart
from bench.reuse import table as reuse_table
from bench.runtimes import measure_apart as measure_runtimes_apart
from bench.runtimes import table as runtimes_table
from bench.sampling import measure_apart as measure_sampling_apart
from bench.sampling import table as sampling_table
from bench.swaps import measure_apart as measure_swaps_apart
from bench.swaps import table as swaps_table
from bench.targets import (
    CEILING,
    DIRECT,
    FLOOR,
    LLHTTP_FLOOR,
    LOAD_CPU,
    PROXIES,
    PROXY_CPU,
    ROOT,
    WRK,
    WRK_LIB,
    Rig,
    nginx_binary,
    raise_fd_limit,
)

DOC = ROOT / "docs" / "benchmarks.md"
DURATION = int(os.environ.get("BENCH_SECONDS", "3"))
ROUNDS = int(os.environ.get("BENCH_ROUNDS", "3"))
CONNECTIONS = (1, 16, 64)


def median_of(runs: list[dict[str, float]]) -> dict[str, float]:
    return {key: statistics.median(run[key] for run in runs) for key in runs[0]}


def ratio(value: float, reference: float) -> str:
    return f"{value / reference:.2f}x" if reference else "—"


TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """CPU time (user + system) of a process and its children alive now (nginx's worker)."""
    total = 0.0
    stack = [pid]
    while stack:
        current = stack.pop()
        try:
            fields = Path(f"/proc/{current}/stat").read_text().rsplit(")", 1)[1].split()
            children = Path(f"/proc/{current}/task/{current}/children").read_text().split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / TICK
        stack += [int(child) for child in children]
    return total


def wrk(url: str, connections: int, pid: int | None = None) -> dict[str, float]:
    """wrk's rate and latency; with `pid`, the CPU that process spent per request (µs)."""
    env = {**os.environ, "LD_LIBRARY_PATH": str(WRK_LIB)}
    argv = [
        str(WRK),
        "-t1",
        f"-c{connections}",
        f"-d{DURATION}s",
        "--latency",
        "-s",
        str(ROOT / "bench" / "post.lua"),
        url + "/api/generate",
    ]
    subprocess.run([*argv[:3], "-d1s", *argv[4:]], env=env, capture_output=True, check=True)
    before = cpu_seconds(pid) if pid is not None else 0.0
    out = subprocess.run(argv, env=env, capture_output=True, text=True, check=True).stdout
    spent = cpu_seconds(pid) - before if pid is not None else 0.0
    rate = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))  # type: ignore[union-attr]
    done = int(re.search(r"(\d+) requests in", out).group(1))  # type: ignore[union-attr]
    errors = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    if errors:
        raise RuntimeError(f"{url}: {errors.group(1)} failed requests\n{out}")

    def latency(pct: str) -> float:
        value, unit = re.search(rf"{pct}%\s+([\d.]+)(us|ms|s)", out).groups()  # type: ignore[union-attr]
        return float(value) * {"us": 0.001, "ms": 1.0, "s": 1000.0}[unit]

    return {
        "rps": rate,
        "p50_ms": latency("50"),
        "p99_ms": latency("99"),
        "cpu_us": spent / done * 1e6 if done else 0.0,
    }


def streams(url: str) -> dict[str, float]:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.streams",
            "--url",
            url,
            "--streams",
            "64",
            "--chunks",
            "100",
            "--interval",
            "0.02",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    result = json.loads(done.stdout)
    if result["failed"]:
        raise RuntimeError(f"{url}: streams failed\n{done.stderr}")
    return result


WS_FPS = 1000
WS_FRAME = 64 * 1024


def ws_bench(url: str, *extra: str) -> dict[str, float]:
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.ws",
            "--url",
            url.replace("http://", "ws://"),
            "--fps",
            str(WS_FPS),
            "--size",
            str(WS_FRAME),
            "--seconds",
            str(DURATION),
            *extra,
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return json.loads(out)


def ws_table(results: dict[str, dict[str, object]]) -> list[str]:
    floor = results["direct"]["ws"]  # type: ignore[index]
    lines = [
        "",
        f"One websocket of {WS_FRAME // 1024} KiB binary preview frames, {WS_FPS:,} a second "
        f"for {DURATION} s (ComfyUI's preview stream, heavier than ComfyUI sends): latency "
        "from the upstream's send to the client's receive, and what the proxy adds to "
        "direct's; the proxy's peak RSS growth while its client reads 50 frames a second "
        "from an upstream that sends as fast as they drain, for the same time:",
        "",
        "| path | frames/s | p50 ms | p99 ms | added p50 ms | added p99 ms | RSS growth, slow |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name, result in results.items():
        if "ws" not in result:
            continue
        row = result["ws"]  # type: ignore[index]
        slow = result.get("ws_slow")
        growth = f"{slow['rss_growth_mib']:.1f} MiB" if slow else "—"  # type: ignore[index]
        lines.append(
            f"| {name} | {row['frames_per_s']:.0f} | {row['latency_p50_ms']:.2f} | "
            f"{row['latency_p99_ms']:.2f} | "
            f"{row['latency_p50_ms'] - floor['latency_p50_ms']:+.2f} | "
            f"{row['latency_p99_ms'] - floor['latency_p99_ms']:+.2f} | {growth} |"
        )
    return lines


def table(
    results: dict[str, dict[str, object]],
    decisions: dict[str, object],
    holds: HoldResults,
    coldstart: ColdStart,
) -> str:
    names = list(results)
    lines = [
        f"Measured {time.strftime('%Y-%m-%d')} on this machine ({os.cpu_count()} cores): the "
        f"proxy under test pinned to CPU {PROXY_CPU}, wrk and the upstream to CPU {LOAD_CPU}; "
        f"the median of {ROUNDS} interleaved rounds of {DURATION} s. Ratios are against the "
        "bare pass-through on asyncio's loop and against nginx (Debian's, one worker, "
        "keepalive to the upstream, nothing buffered), measured in the same run. CPU is the "
        "proxy process's own (user + system, its workers included) per request served; the "
        "tick is 10 ms, so read it to a few per cent.",
        "",
        "| path | conns | req/s | vs bare | vs nginx | p50 ms | p99 ms | CPU µs/req "
        "| CPU vs bare |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for conns in CONNECTIONS:
        floor = results[FLOOR][f"c{conns}"]["rps"]  # type: ignore[index]
        floor_cpu = results[FLOOR][f"c{conns}"]["cpu_us"]  # type: ignore[index]
        ceiling = results.get(CEILING, {}).get(f"c{conns}", {"rps": 0.0})["rps"]  # type: ignore[index,union-attr]
        for name in names:
            row = results[name][f"c{conns}"]  # type: ignore[index]
            cpu = f"{row['cpu_us']:.0f} | {ratio(row['cpu_us'], floor_cpu)}"
            if not row["cpu_us"]:  # direct: the upstream's own CPU is not a proxy's
                cpu = "— | —"
            lines.append(
                f"| {name} | {conns} | {row['rps']:.0f} | {ratio(row['rps'], floor)} | "
                f"{ratio(row['rps'], ceiling)} | {row['p50_ms']:.2f} | {row['p99_ms']:.2f} | "
                f"{cpu} |"
            )
    lines += [
        "",
        "64 concurrent NDJSON streams, 100 chunks each, one chunk every 20 ms per stream. "
        "Time to first byte, from just before a request to its first line: for the 64 "
        "streams, started in one burst (the p99 of 64 is the slowest), and under load, for "
        "short streams a probe starts every 10 ms while the 64 run (about 200), "
        "with what the proxy adds to the bare pass-through's p99:",
        "",
        "| path | chunks/s | vs bare | vs nginx | chunk latency p50 ms | chunk latency p99 ms "
        "| p99 vs bare | p99 vs nginx | burst TTFB p99 ms | under load TTFB p50 / p99 ms "
        "| TTFB p99 minus bare |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    floor_s = results[FLOOR]["streams"]  # type: ignore[index]
    ceiling_s = results.get(CEILING, {}).get("streams", {})  # type: ignore[union-attr]
    for name in (name for name in names if "streams" in results[name]):
        row = results[name]["streams"]  # type: ignore[index]
        lines.append(
            f"| {name} | {row['chunks_per_s']:.0f} | "
            f"{ratio(row['chunks_per_s'], floor_s['chunks_per_s'])} | "  # type: ignore[index]
            f"{ratio(row['chunks_per_s'], ceiling_s.get('chunks_per_s', 0.0))} | "  # type: ignore[union-attr]
            f"{row['chunk_latency_p50_ms']:.2f} | {row['chunk_latency_p99_ms']:.2f} | "
            f"{ratio(row['chunk_latency_p99_ms'], floor_s['chunk_latency_p99_ms'])} | "  # type: ignore[index]
            f"{ratio(row['chunk_latency_p99_ms'], ceiling_s.get('chunk_latency_p99_ms', 0.0))} | "  # type: ignore[union-attr]
            f"{row['ttfb_p99_ms']:.2f} | "
            f"{row['probe_ttfb_p50_ms']:.2f} / {row['probe_ttfb_p99_ms']:.2f} | "
            f"{row['probe_ttfb_p99_ms'] - floor_s['probe_ttfb_p99_ms']:+.2f} |"  # type: ignore[index]
        )
    lines += ws_table(results)
    lines += holds_tables(holds)
    lines += coldstart_table(coldstart)
    lines += ["", "Decision core (in-process, after the proxies stopped):", ""]
    lines += decisions_table(decisions)
    return "\n".join(lines)


def write_doc(text: str) -> None:
    write_section("results", text, DOC)


def main() -> int:
    nginx = nginx_binary()
    if not WRK.exists() or nginx is None:
        print("bench: wrk or nginx is missing; run `make bench`", file=sys.stderr)
        return 2
    os.sched_setaffinity(0, {LOAD_CPU})  # wrk and the stream client inherit this
    raise_fd_limit()
    with tempfile.TemporaryDirectory(prefix="gpugate-bench-") as tmp:
        rig = Rig(Path(tmp))
        try:
            rig.start((DIRECT, *PROXIES, LLHTTP_FLOOR))
            targets = {name: target.url for name, target in rig.targets.items()}
            pids = {name: target.pid for name, target in rig.targets.items() if target.proxy}
            results: dict[str, dict[str, object]] = {name: {} for name in targets}
            for conns in CONNECTIONS:
                runs: dict[str, list[dict[str, float]]] = {name: [] for name in targets}
                for _ in range(ROUNDS):
                    for name, url in targets.items():
                        runs[name].append(wrk(url, conns, pids.get(name)))
                for name in targets:
                    results[name][f"c{conns}"] = median_of(runs[name])
                    print(name, conns, results[name][f"c{conns}"], flush=True)
            # The llhttp client's row is for the request rate only.
            targets.pop(LLHTTP_FLOOR)
            stream_runs: dict[str, list[dict[str, float]]] = {name: [] for name in targets}
            for _ in range(ROUNDS):
                for name, url in targets.items():
                    stream_runs[name].append(streams(url))
            for name in targets:
                results[name]["streams"] = median_of(stream_runs[name])
                print(name, "streams", results[name]["streams"], flush=True)
            ws_runs: dict[str, list[dict[str, float]]] = {name: [] for name in targets}
            for _ in range(ROUNDS):
                for name, url in targets.items():
                    ws_runs[name].append(ws_bench(url))
            for name, url in targets.items():
                results[name]["ws"] = median_of(ws_runs[name])
                if name in pids:
                    results[name]["ws_slow"] = ws_bench(url, "--slow", "--pid", str(pids[name]))
                print(name, "ws", results[name]["ws"], results[name].get("ws_slow"), flush=True)
        finally:
            rig.stop()
        # On processes of their own, started afresh: see bench/holds.py.
        holds = measure_holds(Path(tmp), tuple(targets))
    # A simulated card and whisper-server of its own, after the proxies stopped, in a
    # process of its own: a gate does not carry the heap and threads of the runs before.
    coldstart = measure_coldstart_apart()
    print("coldstart", coldstart, flush=True)
    # Each on processes of its own, with nothing else running (see each module).
    sampling = measure_sampling_apart()
    print("sampling", sampling, flush=True)
    runtimes = measure_runtimes_apart()
    print("runtimes", runtimes, flush=True)
    real = measure_real_apart()
    print("real", real, flush=True)
    reuse = measure_reuse_apart()
    print("reuse", reuse, flush=True)
    swaps = measure_swaps_apart()
    print("swaps", swaps, flush=True)
    decisions = measure_decisions()
    print("decisions", decisions, flush=True)
    alternation = measure_alternation()
    text = table(results, decisions, holds, coldstart)
    write_doc(text)
    print(text)
    targets = goals(results, runtimes, real, CONNECTIONS)  # type: ignore[arg-type]
    for name, lines in (
        ("sampling", sampling_table(sampling)),
        ("runtimes", runtimes_table(runtimes, coldstart)),
        ("real", real_table(real)),
        ("reuse", reuse_table(reuse, REUSE_REQUESTS)),
        ("targets", goals_table(targets)),
        ("swaps", swaps_table(swaps)),
        ("alternation", alternation_table(alternation).splitlines()),
    ):
        write_section(name, "\n".join(lines), DOC)
        print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
