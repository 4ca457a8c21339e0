"""Many idle keep-alive connections: a proxy's memory while it holds them.

Each connection sends one plain request (the small non-streaming generate of bench/post.lua)
and reads its answer, then stays open and silent, as a chat client's between two questions.
No more than OPENING connections are opened at once, as clients arrive over time. When all
are idle, the proxy's RSS is read until it stops moving; then every connection is closed.

    python -m bench.idle --url http://127.0.0.1:P --conns 10000 --pid PID
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import sys
import time
from collections import Counter
from urllib.parse import urlsplit

from bench.measures import vm_rss

OPENING = 64
"""Connections opening (connect, request, answer) at once."""
BODY = b'{"model":"bench","prompt":"hi","stream":false}'
Connection = tuple[asyncio.StreamReader, asyncio.StreamWriter]
SETTLE = 0.2
"""Seconds between two RSS readings once every connection is idle."""


def request(host: str) -> bytes:
    return (
        b"POST /api/generate HTTP/1.1\r\nHost: " + host.encode() + b"\r\n"
        b"Content-Type: application/json\r\nContent-Length: "
        + str(len(BODY)).encode()
        + b"\r\n\r\n"
        + BODY
    )


async def answer(reader: asyncio.StreamReader) -> tuple[int, bool]:
    """Read one response; returns its status and whether the connection stays open."""
    head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
    status = int(head[0].split()[1])
    fields = {
        name.strip().lower(): value.strip()
        for name, _, value in (line.partition(":") for line in head[1:] if line)
    }
    if "content-length" in fields:
        await reader.readexactly(int(fields["content-length"]))
    elif fields.get("transfer-encoding", "").lower() == "chunked":
        while size := int((await reader.readline()).split(b";")[0], 16):
            await reader.readexactly(size + 2)
        await reader.readline()
    else:
        await reader.read()
        return status, False
    return status, fields.get("connection", "").lower() != "close"


async def hold(host: str, port: int, gate: asyncio.Semaphore, held: list[Connection]) -> str:
    """Open one connection and leave it idle after its request; returns how it went."""
    async with gate:
        try:
            reader, writer = await asyncio.open_connection(host, port)
        except OSError as exc:
            return f"connect: {exc!r}"
        try:
            writer.write(request(f"{host}:{port}"))
            status, open_after = await answer(reader)
        except (OSError, asyncio.IncompleteReadError, ValueError) as exc:
            writer.close()
            return f"request: {exc!r}"
    if status != 200 or not open_after:
        writer.close()
        return f"HTTP {status}" + ("" if open_after else ", closed")
    held.append((reader, writer))
    return "held"


async def run(url: str, conns: int, pid: int) -> dict[str, float]:
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    gate = asyncio.Semaphore(OPENING)
    held: list[Connection] = []
    idle = vm_rss(pid)
    start = time.monotonic()
    outcomes = Counter(await asyncio.gather(*(hold(host, port, gate, held) for _ in range(conns))))
    opened = time.monotonic() - start
    # Buffers and handshakes settle once the last answer is out: read until RSS holds still.
    readings = [vm_rss(pid)]
    for _ in range(25):
        await asyncio.sleep(SETTLE)
        readings.append(vm_rss(pid))
        if abs(readings[-1] - readings[-2]) < 64 * 1024 and len(readings) >= 4:
            break
    # Those the proxy closed while they sat idle have read their end by now.
    closed = sum(1 for reader, _ in held if reader.at_eof() or reader.exception())
    for _, writer in held:
        writer.close()
    if closed:
        outcomes["closed by the proxy while idle"] = closed
    for outcome, n in outcomes.items():
        if outcome != "held":
            print(f"bench.idle: {n} connections: {outcome}", file=sys.stderr)
    return {
        "held": float(outcomes["held"] - closed),
        "lost": float(conns - outcomes["held"] + closed),
        "open_s": opened,
        "rss_idle_mib": idle / 2**20,
        "rss_held_mib": max(readings[-3:]) / 2**20,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--conns", type=int, default=10000)
    parser.add_argument("--pid", type=int, required=True, help="the proxy, whose RSS is read")
    args = parser.parse_args()
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard < args.conns + 64:
        raise SystemExit(f"bench.idle: {args.conns} connections need more than {hard} fds")
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    import uvloop

    print(json.dumps(uvloop.run(run(args.url, args.conns, args.pid))))


if __name__ == "__main__":
    main()
