"""A websocket of preview frames: per-frame delivery latency, and a proxy's memory while
its client reads slowly.

Each frame carries the monotonic time the upstream sent it; the client measures when it
arrives (one machine, one clock).

    python -m bench.ws --url ws://127.0.0.1:P --fps 1000 --size 65536 --seconds 3
    python -m bench.ws --url ws://127.0.0.1:P --size 65536 --seconds 3 --slow --pid PID
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time

import aiohttp

from bench.measures import percentile, vm_rss
from bench.upstream import PREVIEW_HEAD

SLOW_READS_PER_S = 50
"""The slow client's pace: 50 frames a second while the upstream offers as many as drain."""


async def latency(url: str, fps: int, size: int, seconds: float) -> dict[str, float]:
    frames = int(fps * seconds)
    latencies: list[float] = []
    async with aiohttp.ClientSession() as session:
        async with session.ws_connect(f"{url}/ws?frames=10&size={size}", max_msg_size=0) as ws:
            async for _ in ws:  # warm the path
                pass
        start = time.monotonic()
        path = f"{url}/ws?frames={frames}&size={size}&fps={fps}&clientId=bench"
        async with session.ws_connect(path, max_msg_size=0) as ws:
            async for msg in ws:
                sent = PREVIEW_HEAD.unpack_from(msg.data)[2]
                latencies.append((time.monotonic_ns() - sent) / 1e6)
        elapsed = time.monotonic() - start
    assert len(latencies) == frames, (len(latencies), frames)
    return {
        "frames_per_s": frames / elapsed,
        "latency_p50_ms": percentile(latencies, 0.50),
        "latency_p99_ms": percentile(latencies, 0.99),
    }


async def slow(url: str, size: int, seconds: float, pid: int) -> dict[str, float]:
    """The proxy's peak RSS growth while its client reads SLOW_READS_PER_S frames a second."""
    reads = int(SLOW_READS_PER_S * seconds)
    before = vm_rss(pid)
    peak = before
    async with (
        aiohttp.ClientSession() as session,
        session.ws_connect(f"{url}/ws?frames={reads * 20}&size={size}", max_msg_size=0) as ws,
    ):
        for _ in range(reads):
            await ws.receive_bytes()
            peak = max(peak, vm_rss(pid))
            await asyncio.sleep(1 / SLOW_READS_PER_S)
    return {"rss_before_mib": before / 2**20, "rss_growth_mib": (peak - before) / 2**20}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--fps", type=int, default=1000)
    parser.add_argument("--size", type=int, default=65536)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--slow", action="store_true")
    parser.add_argument("--pid", type=int)
    args = parser.parse_args()
    import uvloop

    if args.slow:
        result = uvloop.run(slow(args.url, args.size, args.seconds, args.pid))
    else:
        result = uvloop.run(latency(args.url, args.fps, args.size, args.seconds))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
