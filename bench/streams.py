"""Many concurrent NDJSON streams: chunks/s, per-chunk delivery latency, time to first byte.

Each chunk carries the monotonic time the upstream sent it; the client measures when it
arrives (one machine, one clock).

    python -m bench.streams --url http://127.0.0.1:P --streams 64 --chunks 100 --interval 0.02
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time

import aiohttp


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def one(session, url, chunks, interval, latencies, ttfb) -> int:
    body = {
        "model": "bench",
        "prompt": "x",
        "stream": True,
        "options": {"bench_chunks": chunks, "bench_interval": interval},
    }
    sent = time.monotonic_ns()
    count = 0
    async with session.post(url + "/api/generate", json=body) as resp:
        first = True
        async for line in resp.content:
            now = time.monotonic_ns()
            if first:
                ttfb.append((now - sent) / 1e6)
                first = False
            latencies.append((now - json.loads(line)["t"]) / 1e6)
            count += 1
    return count


async def run(url: str, streams: int, chunks: int, interval: float) -> dict[str, float]:
    latencies: list[float] = []
    ttfb: list[float] = []
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:
        await one(session, url, 2, interval, [], [])  # warm the path
        start = time.monotonic()
        counts = await asyncio.gather(
            *(one(session, url, chunks, interval, latencies, ttfb) for _ in range(streams))
        )
        elapsed = time.monotonic() - start
    return {
        "chunks_per_s": sum(counts) / elapsed,
        "chunk_latency_p50_ms": percentile(latencies, 0.50),
        "chunk_latency_p99_ms": percentile(latencies, 0.99),
        "ttfb_p99_ms": percentile(ttfb, 0.99),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--streams", type=int, default=64)
    parser.add_argument("--chunks", type=int, default=100)
    parser.add_argument("--interval", type=float, default=0.02)
    args = parser.parse_args()
    import uvloop

    result = uvloop.run(run(args.url, args.streams, args.chunks, args.interval))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
