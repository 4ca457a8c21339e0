"""Many concurrent NDJSON streams: chunks/s, per-chunk delivery latency, time to first byte;
with --pid, a proxy's memory while it holds them all.

Each chunk carries the monotonic time the upstream sent it; the client measures when it
arrives (one machine, one clock). Time to first byte runs from just before a stream's
request is made to its first line. It is measured twice:

* for the streams themselves, all started at once (a burst: the client's own work to
  start them all is most of it, and the p99 of 64 is their slowest);
* under load: once every stream is running, a probe opens a short stream every 10 ms on
  a keep-alive connection until the streams end, each a sample of the time a new request
  waits for its first line while the proxy relays all the others.

    python -m bench.streams --url http://127.0.0.1:P --streams 64 --chunks 100 --interval 0.02
    python -m bench.streams --url http://127.0.0.1:P --streams 1000 --chunks 10 --interval 0.5 \
        --pid PID
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import sys
import time

import aiohttp
import attrs

from bench.measures import percentile, vm_rss

RSS_EVERY = 0.1
"""Seconds between two readings of the proxy's RSS."""


@attrs.define
class Held:
    """Streams mid-response now: their first line arrived, their last has not."""

    now: int = 0
    started: int = 0
    """Streams whose first line arrived, ended or not."""
    all_started: asyncio.Event = attrs.field(factory=asyncio.Event)
    expected: int = 0


async def one(session, url, chunks, interval, latencies, ttfb, held=None) -> int:
    body = {
        "model": "bench",
        "prompt": "x",
        "stream": True,
        "options": {"bench_chunks": chunks, "bench_interval": interval},
    }
    held = Held() if held is None else held
    sent = time.monotonic_ns()
    count = 0
    async with session.post(url + "/api/generate", json=body) as resp:
        resp.raise_for_status()
        first = True
        try:
            async for line in resp.content:
                now = time.monotonic_ns()
                if first:
                    ttfb.append((now - sent) / 1e6)
                    held.now += 1
                    held.started += 1
                    if held.started == held.expected:
                        held.all_started.set()
                    first = False
                latencies.append((now - json.loads(line)["t"]) / 1e6)
                count += 1
        finally:
            if not first:
                held.now -= 1
    if count != chunks + 1:
        raise RuntimeError(f"{count} lines of {chunks + 1}")
    return count


PROBE_EVERY = 0.01
"""Seconds between the starts of two probes: a fixed pace, so that a faster proxy is not
sent more of them (and more load) than a slower one."""


async def probe(url: str, load: asyncio.Future[object], ttfb: list[float]) -> None:
    """A short stream every PROBE_EVERY seconds (or as soon as the last one ended, when it
    took longer), on one connection, until `load` is done."""
    async with aiohttp.ClientSession() as session:
        start = time.monotonic()
        n = 0
        while not load.done():
            await one(session, url, 0, 0.0, [], ttfb)
            n += 1
            delay = start + n * PROBE_EVERY - time.monotonic()
            if delay > 0:
                await asyncio.wait({load}, timeout=delay)


async def watch(pid: int, held: Held, samples: list[tuple[int, int]]) -> None:
    """(streams held, RSS) every RSS_EVERY seconds until cancelled."""
    while True:
        samples.append((held.now, vm_rss(pid)))
        await asyncio.sleep(RSS_EVERY)


async def run(
    url: str, streams: int, chunks: int, interval: float, pid: int | None = None
) -> dict[str, float]:
    latencies: list[float] = []
    ttfb: list[float] = []
    held = Held(expected=streams)
    probed: list[float] = []
    samples: list[tuple[int, int]] = []
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=None)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        await one(session, url, 2, interval, [], [])  # warm the path
        watcher = None
        if pid is not None:
            idle = vm_rss(pid)
            watcher = asyncio.create_task(watch(pid, held, samples))
        start = time.monotonic()
        load = asyncio.gather(
            *(one(session, url, chunks, interval, latencies, ttfb, held) for _ in range(streams)),
            return_exceptions=True,
        )
        started = asyncio.ensure_future(held.all_started.wait())
        await asyncio.wait({load, started}, return_when=asyncio.FIRST_COMPLETED)
        started.cancel()
        if held.all_started.is_set():
            await probe(url, load, probed)
        outcomes = await load
        elapsed = time.monotonic() - start
        if watcher is not None:
            watcher.cancel()
            samples.append((held.now, vm_rss(pid)))
    counts = [n for n in outcomes if isinstance(n, int)]
    failures = [repr(e) for e in outcomes if isinstance(e, BaseException)]
    for error in sorted(set(failures))[:5]:
        print(f"bench.streams: {failures.count(error)} streams failed: {error}", file=sys.stderr)
    result = {
        "chunks_per_s": sum(counts) / elapsed,
        "chunk_latency_p50_ms": percentile(latencies, 0.50),
        "chunk_latency_p99_ms": percentile(latencies, 0.99),
        "ttfb_p50_ms": percentile(ttfb, 0.50),
        "ttfb_p99_ms": percentile(ttfb, 0.99),
        "probe_ttfb_p50_ms": percentile(probed, 0.50),
        "probe_ttfb_p99_ms": percentile(probed, 0.99),
        "probes": float(len(probed)),
        "failed": float(len(failures)),
    }
    if pid is not None:
        # The plateau: the readings taken while the most streams were held at once.
        most = max(n for n, _ in samples)
        result["held"] = float(most)
        result["rss_idle_mib"] = idle / 2**20
        result["rss_held_mib"] = max(rss for n, rss in samples if n == most) / 2**20
    return result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--streams", type=int, default=64)
    parser.add_argument("--chunks", type=int, default=100)
    parser.add_argument("--interval", type=float, default=0.02)
    parser.add_argument("--pid", type=int, help="the proxy's process, whose RSS is read")
    args = parser.parse_args()
    # One descriptor a stream, and the proxy's upstream side is not ours.
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    import uvloop

    result = uvloop.run(run(args.url, args.streams, args.chunks, args.interval, args.pid))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
