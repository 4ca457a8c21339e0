"""What holding many costs: time to first byte with 1,000 streams started at once, the proxy's
memory while it holds them, and its memory while it holds 10,000 idle keep-alive connections.

Each part runs on proxies started afresh for it, so that one part's freed memory, kept by
the process for reuse, does not hide the next part's growth; a proxy's idle RSS is read
after a few requests have warmed it. The streams are measured in BENCH_HOLD_ROUNDS
interleaved rounds (1 by default), the median kept; the idle connections once per proxy.
`make bench` runs this after its other parts; alone, for one target or more:

    python -m bench.holds --target gate-asyncio [--target bare-asyncio ...] [--only streams]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from bench.targets import (
    CEILING,
    DIRECT,
    FLOOR,
    IDLE_CONNECTIONS,
    LOAD_CPU,
    PROXIES,
    Rig,
    Target,
    raise_fd_limit,
)

HOLD_STREAMS = int(os.environ.get("BENCH_HOLD_STREAMS", "1000"))
HOLD_CHUNKS = 10
HOLD_INTERVAL = 0.5
"""One chunk every half second for 5 s: 2,000 chunks a second through one core."""
HOLD_ROUNDS = int(os.environ.get("BENCH_HOLD_ROUNDS", "1"))
KEYS = {
    "direct": DIRECT,
    "bare-asyncio": FLOOR,
    "bare-uvloop": PROXIES[1],
    "nginx": CEILING,
    "gate-asyncio": PROXIES[3],
    "gate-uvloop": PROXIES[4],
}
WARM_REQUESTS = 20
Results = dict[str, dict[str, dict[str, float]]]


def client(module: str, *args: str) -> dict[str, float]:
    """Run a client on the load core; its complaints go to stderr as they are."""
    done = subprocess.run(
        [sys.executable, "-m", module, *args],
        capture_output=True,
        text=True,
        check=True,
        preexec_fn=lambda: os.sched_setaffinity(0, {LOAD_CPU}),
    )
    sys.stderr.write(done.stderr)
    return json.loads(done.stdout)


def warm(url: str) -> None:
    body = b'{"model":"bench","prompt":"hi","stream":false}'
    for _ in range(WARM_REQUESTS):
        post = urllib.request.Request(url + "/api/generate", data=body, method="POST")
        with urllib.request.urlopen(post, timeout=10) as resp:
            resp.read()


def show_log(rig: Rig, name: str) -> None:
    """A gate's own warnings, when its clients saw a failure."""
    log = rig.logs.get(name)
    if log is not None and log.exists():
        sys.stderr.write(f"--- {name}: its log\n{log.read_text()[-4000:]}")


def streams(rig: Rig, names: tuple[str, ...], rounds: int) -> dict[str, dict[str, float]]:
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in names}
    for _ in range(rounds):
        for name in names:
            target: Target = rig.targets[name]
            args = ["--url", target.url, "--streams", str(HOLD_STREAMS)]
            args += ["--chunks", str(HOLD_CHUNKS), "--interval", str(HOLD_INTERVAL)]
            run = client("bench.streams", *args, "--pid", str(target.pid))
            if run["failed"]:
                show_log(rig, name)
            runs[name].append(run)
            print(name, f"{HOLD_STREAMS} streams", run, flush=True)
    results = {}
    for name, done in runs.items():
        row = {key: statistics.median(run[key] for run in done) for key in done[0]}
        # Memory is not given back between rounds: idle is the fresh process's, held the peak.
        row["rss_idle_mib"] = done[0]["rss_idle_mib"]
        row["rss_held_mib"] = max(run["rss_held_mib"] for run in done)
        row["held"] = min(run["held"] for run in done)
        row["failed"] = sum(run["failed"] for run in done)
        results[name] = row
    return results


def idle(rig: Rig, names: tuple[str, ...]) -> dict[str, dict[str, float]]:
    results = {}
    for name in names:
        target = rig.targets[name]
        args = ["--url", target.url, "--conns", str(IDLE_CONNECTIONS), "--pid", str(target.pid)]
        results[name] = client("bench.idle", *args)
        if results[name]["lost"]:
            show_log(rig, name)
        print(name, f"{IDLE_CONNECTIONS} idle", results[name], flush=True)
    return results


@contextlib.contextmanager
def fresh(tmp: Path, names: tuple[str, ...]) -> Iterator[Rig]:
    """The targets named, started afresh and warmed; stopped on the way out."""
    rig = Rig(tmp)
    try:
        rig.start(names)
        for name in names:
            warm(rig.targets[name].url)
        yield rig
    finally:
        rig.stop()


def measure(
    tmp: Path, names: tuple[str, ...], rounds: int = HOLD_ROUNDS, parts: tuple[str, ...] = ()
) -> Results:
    """Each part ("streams", "idle"; all when empty) on its own fresh set of processes."""
    raise_fd_limit()
    results: Results = {}
    if not parts or "streams" in parts:
        with fresh(tmp, names) as rig:
            results["streams"] = streams(rig, names, rounds)
    if not parts or "idle" in parts:
        with fresh(tmp, names) as rig:
            results["idle"] = idle(rig, names)
    return results


def tables(results: Results, rounds: int = HOLD_ROUNDS) -> list[str]:
    """The results block's part for these measurements."""
    lines: list[str] = []
    if "streams" in results:
        rows = results["streams"]
        floor = rows.get(FLOOR, {})
        lines += [
            "",
            f"{HOLD_STREAMS:,} NDJSON streams started at once, {HOLD_CHUNKS} chunks each, one "
            f"every {HOLD_INTERVAL * 1000:.0f} ms per stream ("
            + (f"median of {rounds} interleaved rounds" if rounds > 1 else "one round")
            + "). Time to first byte, from just before a request to its first line: for the "
            "streams themselves, started in one burst, and under load, for the probe's short "
            "streams, one every 10 ms while all of them are held (`probes`: how many); "
            "what the proxy adds to the bare pass-through's p99; the chunks' delivery p99; "
            "the process's RSS while it held the most streams at once, and its growth over "
            "the same process idle (fresh, warmed by 20 requests; for direct, the upstream's "
            "own):",
            "",
            "| path | burst TTFB p50 / p99 ms | under load TTFB p50 / p99 ms | probes "
            "| p99 minus bare | chunk p99 ms | held at once | failed | RSS held MiB "
            "| RSS growth MiB |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for name, row in rows.items():
            base = floor.get("probe_ttfb_p99_ms")
            minus = f"{row['probe_ttfb_p99_ms'] - base:+.2f}" if base is not None else "—"
            lines.append(
                f"| {name} | {row['ttfb_p50_ms']:.0f} / {row['ttfb_p99_ms']:.0f} | "
                f"{row['probe_ttfb_p50_ms']:.2f} / {row['probe_ttfb_p99_ms']:.2f} | "
                f"{row['probes']:.0f} | {minus} | "
                f"{row['chunk_latency_p99_ms']:.1f} | {row['held']:,.0f} | {row['failed']:.0f} | "
                f"{row['rss_held_mib']:.1f} | {row['rss_held_mib'] - row['rss_idle_mib']:+.1f} |"
            )
    if "idle" in results:
        lines += [
            "",
            f"{IDLE_CONNECTIONS:,} idle keep-alive client connections, each opened after the "
            "last ones (64 at a time), sent one small non-streaming generate, read its answer "
            "and then left silent: the process's RSS once all are idle, and per connection "
            "over the same process idle (fresh, warmed by 20 requests; for direct, the "
            "upstream's own):",
            "",
            "| path | held | RSS idle MiB | RSS held MiB | growth MiB | KiB per connection |",
            "|---|---:|---:|---:|---:|---:|",
        ]
        for name, row in results["idle"].items():
            growth = row["rss_held_mib"] - row["rss_idle_mib"]
            per = f"{growth * 1024 / row['held']:.1f}" if row["held"] else "—"
            lines.append(
                f"| {name} | {row['held']:,.0f} | {row['rss_idle_mib']:.1f} | "
                f"{row['rss_held_mib']:.1f} | {growth:+.1f} | {per} |"
            )
        _, fds = resource.getrlimit(resource.RLIMIT_NOFILE)
        lines += [
            f"\n{name}: {row['lost']:,.0f} connections refused or closed; this machine's "
            f"open-files limit is {fds:,}."
            for name, row in results["idle"].items()
            if row["lost"]
        ]
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", action="append", choices=list(KEYS), default=[])
    parser.add_argument("--only", choices=["streams", "idle"], action="append", default=[])
    parser.add_argument("--rounds", type=int, default=HOLD_ROUNDS)
    args = parser.parse_args()
    picked = {KEYS[key] for key in args.target} or set(KEYS.values())
    names = tuple(name for name in KEYS.values() if name in picked)
    os.sched_setaffinity(0, {LOAD_CPU})
    with tempfile.TemporaryDirectory(prefix="gpugate-holds-") as tmp:
        results = measure(Path(tmp), names, args.rounds, tuple(args.only))
    print("\n".join(tables(results, args.rounds)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
