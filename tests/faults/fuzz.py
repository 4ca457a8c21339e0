"""Fuzz the gate over the simulated Ollama: `python -m tests.faults.fuzz --requests N --seed S`.

Starts `gpugate sim run` and `gpugate serve` (tests.faults.stack), sends N generated
requests (tests.faults.fuzzgen) as raw bytes to the gate and its control listener, and
checks: no 5xx that the gate originated (a capacity class with X-GPUGate-Failure is an
answer; aiohttp's "Server got itself in trouble" is not), no traceback on the gate's
stderr, no lease or ticket left, the gate's RSS grown by less than 10 %. Prints a summary
table; exits 1 when a check fails.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import attrs

from tests.faults.fuzzgen import FuzzRequest, Target, generate
from tests.faults.stack import CAPACITY_CLASSES, Stack, eventually, stack

UPSTREAM_CLASSES = {"RUNTIME_CRASH", "TIMEOUT"}
CONCURRENCY = 8
ANSWER_TIMEOUT = 15.0
RSS_GROWTH_LIMIT = 0.10
WARMUP = 0.1
"""Fraction of the run after which the RSS baseline is taken (imports and caches settled)."""


@attrs.frozen
class Answer:
    status: int | None
    """None: the connection closed without a status line (a legitimate answer to garbage)."""
    failure: str | None
    body: bytes
    content_type: str = ""


async def exchange(port: int, raw: bytes, *, close_after: bool) -> Answer:
    """Write `raw`, optionally close the write side, read one response (or none)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(raw)
        await writer.drain()
        if close_after and writer.can_write_eof():
            writer.write_eof()
        async with asyncio.timeout(ANSWER_TIMEOUT):
            try:
                head = await reader.readuntil(b"\r\n\r\n")
            except (asyncio.IncompleteReadError, ConnectionError):
                return Answer(None, None, b"")
            # The head is enough to judge; a bounded read of the body finds aiohttp's 500 page.
            try:
                body = await asyncio.wait_for(reader.read(4096), 2.0)
            except (TimeoutError, ConnectionError):
                body = b""
    finally:
        writer.close()
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ")
    status = int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else None
    failure, content_type = None, ""
    for line in lines[1:]:
        name, _, value = line.partition(":")
        if name.strip().lower() == "x-gpugate-failure":
            failure = value.strip()
        elif name.strip().lower() == "content-type":
            content_type = value.strip()
        elif name.strip().lower() == "content-length" and value.strip().isdigit():
            # What follows is the answer to bytes the client sent past its body's end.
            body = body[: int(value.strip())]
    return Answer(status, failure, body, content_type)


def rss(pid: int) -> int:
    """Resident set size in bytes, from /proc."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for {pid}")


@attrs.define
class Report:
    requests: int
    seed: int
    outcomes: Counter[str] = attrs.field(factory=Counter)
    gate_5xx: list[str] = attrs.field(factory=list)
    upstream_5xx: int = 0
    no_answer: int = 0
    tracebacks: int = 0
    traceback_sample: list[str] = attrs.field(factory=list)
    leases_left: int = 0
    tickets_left: int = 0
    rss_start: int = 0
    rss_end: int = 0
    seconds: float = 0.0

    @property
    def rss_growth(self) -> float:
        return (self.rss_end - self.rss_start) / self.rss_start if self.rss_start else 0.0

    def problems(self) -> list[str]:
        found = [f"gate 5xx: {line}" for line in self.gate_5xx[:20]]
        if self.tracebacks:
            found.append(f"{self.tracebacks} traceback(s) on the gate's stderr, the first:")
            found.extend(self.traceback_sample)
        if self.leases_left or self.tickets_left:
            found.append(f"left: {self.leases_left} lease(s), {self.tickets_left} ticket(s)")
        if self.rss_growth >= RSS_GROWTH_LIMIT:
            found.append(f"RSS grew {self.rss_growth:.1%} (limit {RSS_GROWTH_LIMIT:.0%})")
        return found

    def table(self) -> str:
        rows = [
            ("requests", str(self.requests)),
            ("seed", str(self.seed)),
            ("seconds", f"{self.seconds:.1f}"),
            *((f"  {k}", str(v)) for k, v in sorted(self.outcomes.items())),
            ("gate-originated 5xx", str(len(self.gate_5xx))),
            ("upstream failures, classed", str(self.upstream_5xx)),
            ("connection closed, no status", str(self.no_answer)),
            ("tracebacks on stderr", str(self.tracebacks)),
            ("leases / tickets left", f"{self.leases_left} / {self.tickets_left}"),
            ("gate RSS start -> end", f"{self.rss_start >> 20} -> {self.rss_end >> 20} MiB"),
            ("RSS growth", f"{self.rss_growth:+.1%}"),
        ]
        width = max(len(k) for k, _ in rows)
        return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


async def judge(s: Stack, request: FuzzRequest, report: Report) -> None:
    port = s.listen_port if request.target is Target.GATE else s.control_port
    close = request.framing.name in ("CUT_SHORT", "NONE")
    try:
        answer = await exchange(port, request.raw, close_after=close)
    except TimeoutError:
        report.gate_5xx.append(f"no answer within {ANSWER_TIMEOUT}s: {request.raw[:120]!r}")
        return
    except ConnectionError:
        answer = Answer(None, None, b"")
    if answer.status is None:
        report.no_answer += 1
        report.outcomes[f"{request.target.value} closed"] += 1
        return
    key = f"{request.target.value} {answer.status}" + (
        f" {answer.failure}" if answer.failure else ""
    )
    report.outcomes[key] += 1
    if answer.status < 500 or answer.failure in CAPACITY_CLASSES:
        return
    if answer.failure in UPSTREAM_CLASSES:
        # The gate reporting that the runtime dropped the request (the simulated Ollama is
        # aiohttp, and closes on a body it cannot decode where Ollama would answer 400).
        report.upstream_5xx += 1
        return
    if request.target is Target.CONTROL and request.path.startswith("/gate/v1/health"):
        return  # 503: the gate says it is not healthy, which it may be mid-run
    if answer.failure is None and request.target is Target.GATE:
        # Forwarded as the runtime answered? Ask the simulated Ollama the same thing.
        assert s.host.ollama is not None
        again = await exchange(s.upstream_port, request.raw, close_after=close)
        if again.status is None or again.status >= 500:
            report.upstream_5xx += 1
            return
    report.gate_5xx.append(
        f"{answer.status} {answer.failure} {answer.body[:80]!r} <- {request.raw[:160]!r}"
    )


async def run(requests: int, seed: int, directory: Path) -> Report:
    """Start the stack, send the requests, collect the report."""
    report = Report(requests, seed)
    rng = random.Random(seed)
    async with stack(directory, gate={"ttl": "5s"}) as s:
        host = f"127.0.0.1:{s.listen_port}"
        batch = [generate(rng, host) for _ in range(requests)]
        queue: asyncio.Queue[tuple[int, FuzzRequest]] = asyncio.Queue()
        for item in enumerate(batch):
            queue.put_nowait(item)
        warm = max(1, int(requests * WARMUP))
        started = time.monotonic()

        async def worker() -> None:
            while not queue.empty():
                n, request = queue.get_nowait()
                if n == warm:
                    report.rss_start = rss(s.gate.pid)
                await judge(s, request, report)

        await asyncio.gather(*(worker() for _ in range(CONCURRENCY)))
        report.seconds = time.monotonic() - started
        if not report.rss_start:
            report.rss_start = rss(s.gate.pid)
        try:
            document = await eventually(
                s.gate.status, lambda d: d["leases"] == [] and d["queue"] == [], timeout=20
            )
        except AssertionError:
            document = await s.gate.status()
        report.leases_left = len(document["leases"])
        report.tickets_left = len(document["queue"])
        report.rss_end = rss(s.gate.pid)
        lines = await asyncio.to_thread(s.gate.stderr_lines)
        report.tracebacks = sum(1 for line in lines if line.startswith("Traceback"))
        report.traceback_sample = _first_traceback(lines)
    return report


def _first_traceback(lines: list[str]) -> list[str]:
    """Each distinct exception line that ends a traceback, with how often it was seen."""
    seen: Counter[str] = Counter()
    for n, line in enumerate(lines):
        if line.startswith("Traceback"):
            tail = n + 1
            while tail < len(lines) and lines[tail].startswith(" "):
                tail += 1
            if tail < len(lines):
                seen[lines[tail][:160]] += 1
    found = [f"{count} x {line}" for line, count in seen.most_common()]
    first = next((n for n, line in enumerate(lines) if line.startswith("Traceback")), None)
    if first is not None:
        # The whole first traceback, with the log line that introduced it.
        end = first + 1
        while end < len(lines) and lines[end].startswith(" "):
            end += 1
        found.extend(lines[max(0, first - 1) : end + 1])
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.faults.fuzz", description=__doc__)
    parser.add_argument("--requests", type=int, default=10_000)
    parser.add_argument("--seed", type=int, default=20261201)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="gpugate-fuzz-") as directory:
        report = asyncio.run(run(args.requests, args.seed, Path(directory)))
    print(report.table())
    problems = report.problems()
    for problem in problems:
        print("FAIL", problem)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
