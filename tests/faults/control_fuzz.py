"""Fuzz the control listener: `python -m tests.faults.control_fuzz --requests N --seed S`.

Starts `gpugate sim run` and `gpugate serve` (tests.faults.stack) with control tokens and
an identity, sends N hostile requests (tests.faults.controlgen) to every route of the
control listener as raw bytes, and checks: no 5xx but the gate's capacity answers (a 503
with its failure class) and an unhealthy /health, every refusal a handler or aiohttp's
router wrote in the API's shape (`{"error": {"class", "message"}}`: what the HTTP parser
refuses before any handler runs is aiohttp's own text, and the Host check's 403 is empty
by design), no traceback on the gate's stderr, no lease or ticket left once the leases the
fuzz was granted lapse (gate.max_lease_ttl is 5 s here), the gate's RSS grown by less than
10 %. Prints a summary table; exits 1 when a check fails.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import tempfile
import time
from pathlib import Path

import attrs

from tests.faults.controlgen import IDENTITIES, SETTINGS, generate_control
from tests.faults.fuzz import ANSWER_TIMEOUT, WARMUP, Answer, Report, exchange, rss
from tests.faults.fuzz import _first_traceback as first_traceback
from tests.faults.fuzzgen import FuzzRequest
from tests.faults.stack import CAPACITY_CLASSES, Stack, eventually, stack

CONCURRENCY = 8
ANSWERED_503 = CAPACITY_CLASSES | {"RESIDENCY_CONFLICT"}
"""503 classes the control API answers a lease request with: no room (with Retry-After),
or its consumer is draining (a drain the fuzz itself asked for)."""


@attrs.define
class ControlReport(Report):
    off_shape: list[str] = attrs.field(factory=list)
    """Refusals a handler or the router wrote that are not in the API's error shape."""
    parser_refusals: int = 0
    """Requests aiohttp's HTTP parser refused before any handler ran (its own 400 text)."""
    left: list[object] = attrs.field(factory=list)
    """The leases and tickets left at the end, as the status document shows them."""

    def problems(self) -> list[str]:
        found = super().problems()
        found += [f"not in the API's shape: {line}" for line in self.off_shape[:20]]
        found += [f"left: {json.dumps(item)}" for item in self.left[:20]]
        return found

    def table(self) -> str:
        lines = super().table().splitlines()
        width = len(lines[0]) - len(str(self.requests)) - 2
        extra = [
            ("refused by the HTTP parser", str(self.parser_refusals)),
            ("refusals not in the API's shape", str(len(self.off_shape))),
        ]
        return "\n".join(lines + [f"{k:<{width}}  {v}" for k, v in extra])


def error_class(answer: Answer) -> str | None:
    """The class of an answer in the API's error shape, `{"error": {"class": str,
    "message": str}}` and nothing else; None for any other answer."""
    if not answer.content_type.startswith("application/json"):
        return None
    try:
        document = json.loads(answer.body)
    except ValueError:
        return None
    error = document.get("error") if isinstance(document, dict) else None
    if set(document) != {"error"} or not isinstance(error, dict):
        return None
    shown, message = error.get("class"), error.get("message")
    return shown if isinstance(shown, str) and isinstance(message, str) else None


PARSER_REFUSALS = {(400, b"400 Bad Request"), (405, b"405 method not allowed")}
"""What the listener answers when aiohttp's HTTP parser refuses a request line, a header
or the framing (gpugate.proxy.guard's handler), before the app saw a request. Bytes past
a body's end in the same packet are parsed at once as the next request, so a request the
handler would have answered may get this instead: aiohttp drops what it parsed of it."""


def from_the_parser(answer: Answer) -> bool:
    """The listener's plain answer to what the HTTP parser refused."""
    return (answer.status, answer.body) in PARSER_REFUSALS


async def judge(s: Stack, request: FuzzRequest, report: ControlReport) -> None:
    close = request.framing.name in ("CUT_SHORT", "NONE")
    try:
        answer = await exchange(s.control_port, request.raw, close_after=close)
    except TimeoutError:
        report.gate_5xx.append(f"no answer within {ANSWER_TIMEOUT}s: {request.raw[:120]!r}")
        return
    except ConnectionError:
        answer = Answer(None, None, b"")
    if answer.status is None:
        report.no_answer += 1
        report.outcomes["closed"] += 1
        return
    shown = answer.failure or error_class(answer)
    key = f"{request.method} {answer.status}" + (f" {shown}" if shown else "")
    report.outcomes[key] += 1
    seen = f"{answer.status} {answer.body[:100]!r} <- {request.raw[:160]!r}"
    if answer.status >= 500:
        if answer.status == 503 and answer.failure in ANSWERED_503:
            return
        if answer.status == 503 and request.path.startswith("/gate/v1/health"):
            return  # the gate says it is not healthy, which it may be mid-run
        report.gate_5xx.append(seen)
        return
    if answer.status < 400 or request.method == "HEAD" or len(answer.body) >= 4096:
        return
    if from_the_parser(answer):
        report.parser_refusals += 1
        return
    if answer.status == 403 and not answer.body:
        return  # the Host check: empty, so a rebinding page reads nothing
    if error_class(answer) is None:
        report.off_shape.append(seen)


async def run(requests: int, seed: int, directory: Path) -> ControlReport:
    """Start the stack, send the requests, collect the report."""
    report = ControlReport(requests, seed)
    rng = random.Random(seed)
    async with stack(directory, gate={"settings": SETTINGS, "extra": IDENTITIES}) as s:
        host = f"127.0.0.1:{s.control_port}"
        batch = [generate_control(rng, host) for _ in range(requests)]
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
            # Leases the fuzz was granted lapse within gate.max_lease_ttl (5 s).
            document = await eventually(
                s.gate.status, lambda d: d["leases"] == [] and d["queue"] == [], timeout=30
            )
        except AssertionError:
            document = await s.gate.status()
        report.leases_left = len(document["leases"])
        report.tickets_left = len(document["queue"])
        report.left = [*document["leases"], *document["queue"]]
        if report.left:
            report.left.append(await s.gate.get_json("/gate/v1/leases"))
        report.rss_end = rss(s.gate.pid)
        lines = await asyncio.to_thread(s.gate.stderr_lines)
        report.tracebacks = sum(1 for line in lines if line.startswith("Traceback"))
        report.traceback_sample = first_traceback(lines)
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.faults.control_fuzz", description=__doc__
    )
    parser.add_argument("--requests", type=int, default=10_000)
    parser.add_argument("--seed", type=int, default=20261203)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="gpugate-control-fuzz-") as directory:
        report = asyncio.run(run(args.requests, args.seed, Path(directory)))
    print(report.table())
    problems = report.problems()
    for problem in problems:
        print("FAIL", problem)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
