"""Fuzz the gate with an oracle: `python -m tests.faults.oracle_fuzz --requests N --seed S`.

The gate's promise is that nothing reaches a runtime's VRAM without a lease, and that
nobody's model is evicted for a request the runtime would refuse. Behind the gate sit
independent readers (tests.faults.oracle_stack): the Go oracle in front of the simulated
Ollama, and the simulated ComfyUI. Each records every request it read, and whether it
could load a model. Checked, for every case:

* bypass: a request a reader says could load reached it without a lease granted before
  it arrived, or under a lease for another model;
* wrongful: a request a reader says its runtime refused was admitted as a demand (leased,
  or queued for capacity: either may have evicted someone's model);
* no 5xx the gate originated except the runtimes' own answers it writes in their shape,
  no traceback on its stderr, no lease or ticket left at the end;
* mislabelled: a request Ollama refuses only once its model is loaded (a format or a
  template it cannot use) was answered as a failed load (MODEL_LOAD_FAILED, GPU_OOM);
* the simulated Ollama read every request as the oracle did (oracle_compare.py): whether it
  could load, which model, keep_alive and runner options, what it refused once loaded,
  whether its body was malformed.

Prints a table and, on failure, the seed and each failing case's bytes; `--case ID` replays
one case of a seed on a fresh stack. Exits 1 when a check fails.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import aiohttp
import attrs
import httptools

from tests.faults.oracle_compare import Comparison, compare, read_readings
from tests.faults.oracle_stack import OracleStack, oracle_stack
from tests.faults.oraclegen import Case, Corpus, Listener
from tests.faults.records import WhisperRoute, read_prompt_records, read_whisper_records
from tests.faults.stack import CAPACITY_CLASSES, eventually
from tests.oracle.oracle import read_records

CONCURRENCY = 16
ANSWER_TIMEOUT = 20.0
UPSTREAM_CLASSES = {"RUNTIME_CRASH", "TIMEOUT", "MODEL_LOAD_FAILED", "GPU_OOM", "START_BACKOFF"}
LOAD_FAILURES = {"MODEL_LOAD_FAILED", "GPU_OOM"}
RUNTIME_SHAPED = (
    b"Unsupported transfer encoding",  # Go's net/http, for a coding it does not frame
    b"500 Internal Server Error\n\nServer got itself in trouble",  # aiohttp, ComfyUI
)
"""5xx bodies the gate writes in a runtime's own shape, where that runtime answers so."""


@attrs.define
class Answer:
    status: int | None = None
    lease: str | None = None
    failure: str | None = None
    body: bytes = b""


class _Parser:
    """llhttp callbacks collecting answers off one connection."""

    def __init__(self, head_only: bool) -> None:
        self.answers: list[Answer] = []
        self.current = Answer()
        self.head_only = head_only
        self.parser = httptools.HttpResponseParser(self)

    def on_header(self, name: bytes, value: bytes) -> None:
        lowered = name.lower()
        if lowered == b"x-gpugate-lease":
            self.current.lease = value.decode("latin-1")
        elif lowered == b"x-gpugate-failure":
            self.current.failure = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        self.current.status = self.parser.get_status_code()
        if self.head_only:
            self._done()

    def on_body(self, body: bytes) -> None:
        if len(self.current.body) < 4096:
            self.current.body += body[:4096]

    def on_message_complete(self) -> None:
        if not self.head_only:
            self._done()

    def _done(self) -> None:
        if self.current.status is not None and self.current.status >= 200:
            self.answers.append(self.current)
        self.current = Answer()


async def exchange(port: int, case: Case) -> list[Answer]:
    """Write a case's bytes and read its answers (fewer when the gate closes first)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    collected = _Parser(case.head_only)
    try:
        writer.write(case.raw)
        await writer.drain()
        if case.close_after and writer.can_write_eof():
            writer.write_eof()
        async with asyncio.timeout(ANSWER_TIMEOUT):
            while len(collected.answers) < case.answers:
                data = await reader.read(65536)
                if not data:
                    # A body framed by the connection's end ends here.
                    with contextlib.suppress(httptools.HttpParserError):
                        collected.parser.feed_data(b"")
                    if collected.current.status and collected.current.status >= 200:
                        collected.answers.append(collected.current)
                    break
                collected.parser.feed_data(data)
    except (ConnectionError, httptools.HttpParserError):
        pass
    finally:
        writer.close()
    return collected.answers


@attrs.define
class Grant:
    model: str
    wall: float


@attrs.define
class Report:
    requests: int
    seed: int
    kinds: Counter[str] = attrs.field(factory=Counter)
    outcomes: Counter[str] = attrs.field(factory=Counter)
    bypasses: list[str] = attrs.field(factory=list)
    wrongful: list[str] = attrs.field(factory=list)
    mislabelled: list[str] = attrs.field(factory=list)
    gate_5xx: list[str] = attrs.field(factory=list)
    timeouts: list[str] = attrs.field(factory=list)
    tracebacks: int = 0
    traceback_sample: list[str] = attrs.field(factory=list)
    leases_left: int = 0
    left_sample: list[str] = attrs.field(factory=list)
    tickets_left: int = 0
    events_dropped: int = 0
    loads_read: int = 0
    refusals_read: int = 0
    undecided: int = 0
    reasons: Counter[str] = attrs.field(factory=Counter)
    """Why the oracle said Ollama would not load, by the reason's first word."""
    readings: Comparison = attrs.field(factory=Comparison)
    """The simulated Ollama's reading of each request against the oracle's."""
    whisper_loads: int = 0
    prompts_queued: int = 0
    prompts_refused: int = 0
    seconds: float = 0.0

    def problems(self) -> list[str]:
        found = []
        for name, items in (
            ("bypass", self.bypasses),
            ("wrongful", self.wrongful),
            ("mislabelled", self.mislabelled),
            ("gate 5xx", self.gate_5xx),
            ("no answer", self.timeouts),
            ("simulator reads otherwise", self.readings.disagreements),
        ):
            found += [f"{name}: {item}" for item in items[:20]]
        if self.tracebacks:
            found.append(f"{self.tracebacks} traceback(s) on the gate's stderr:")
            found += self.traceback_sample
        if self.leases_left or self.tickets_left:
            found.append(f"left: {self.leases_left} lease(s), {self.tickets_left} ticket(s)")
            found += self.left_sample
        if self.events_dropped:
            found.append(f"{self.events_dropped} events dropped: grants could not be checked")
        return found

    def table(self) -> str:
        rows = [
            ("requests", str(self.requests)),
            ("seed", str(self.seed)),
            ("seconds", f"{self.seconds:.1f}"),
            ("Ollama requests the oracle read as loads", str(self.loads_read)),
            ("Ollama requests the oracle read as refused", str(self.refusals_read)),
            ("Ollama requests the oracle could not decide", str(self.undecided)),
            ("Ollama requests the simulator read too (compared)", str(self.readings.compared)),
            (
                "  of which loads / refused once loaded / malformed",
                f"{self.readings.loads} / {self.readings.refused_after_load} / "
                f"{self.readings.malformed}",
            ),
            ("simulator and oracle disagree", str(len(self.readings.disagreements))),
            (
                "ComfyUI prompts queued / refused by ComfyUI",
                f"{self.prompts_queued} / {self.prompts_refused}",
            ),
            ("whisper /load switches", str(self.whisper_loads)),
            ("bypasses (a load without its lease)", str(len(self.bypasses))),
            ("wrongful (a refused request admitted)", str(len(self.wrongful))),
            ("mislabelled (a refusal once loaded as a failed load)", str(len(self.mislabelled))),
            ("gate-originated 5xx", str(len(self.gate_5xx))),
            ("cases without an answer", str(len(self.timeouts))),
            ("tracebacks on stderr", str(self.tracebacks)),
            ("leases / tickets left", f"{self.leases_left} / {self.tickets_left}"),
            ("events dropped", str(self.events_dropped)),
        ]
        rows += [
            (f"  loads on a route not simulated: {k}", str(v))
            for k, v in sorted(self.readings.unsimulated.items())
        ]
        rows += [(f"  refused: {k}", str(v)) for k, v in self.reasons.most_common()]
        rows += [(f"  {k}", str(v)) for k, v in sorted(self.outcomes.items())]
        width = max(len(k) for k, _ in rows)
        return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


class EventFollower:
    """Every lease grant the gate reports, by lease id, with its wall time."""

    def __init__(self, control: str) -> None:
        self.control = control
        self.grants: dict[str, Grant] = {}
        self.dropped = 0
        self.ready = asyncio.Event()
        self.task: asyncio.Task[None] | None = None

    async def run(self) -> None:
        timeout = aiohttp.ClientTimeout(total=None, sock_read=None)
        async with (
            aiohttp.ClientSession(timeout=timeout) as session,
            session.get(self.control + "/gate/v1/events?follow=1") as resp,
        ):
            kind = ""
            async for raw in resp.content:
                line = raw.decode().rstrip("\n")
                if line.startswith(":"):
                    self.ready.set()
                elif line.startswith("event: "):
                    kind = line[7:]
                elif line.startswith("data: ") and kind == "event":
                    event = json.loads(line[6:])
                    if event.get("event") == "lease_granted" and "lease" in event:
                        self.grants[str(event["lease"])] = Grant(event["model"], event["time"])
                elif line.startswith("data: ") and kind == "dropped":
                    self.dropped += json.loads(line[6:])["events"]

    async def start(self) -> None:
        self.task = asyncio.create_task(self.run())
        await asyncio.wait_for(self.ready.wait(), 10)

    async def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.task


def _port(s: OracleStack, listener: Listener) -> int:
    ports = s.ports
    return {
        Listener.OLLAMA: ports.ollama_listen,
        Listener.COMFYUI: ports.comfy_listen,
        Listener.WHISPER: ports.whisper_listen,
        Listener.CONTROL: ports.control,
    }[listener]


async def run(
    requests: int, seed: int, directory: Path, *, only: str | None = None
) -> tuple[Report, dict[str, Case]]:
    """Start the stack, send the corpus (or one case of it), check every case."""
    report = Report(requests, seed)
    async with oracle_stack(directory) as s:
        ports = s.ports
        corpus = Corpus(
            random.Random(seed), ports.ollama_listen, ports.comfy_listen, ports.whisper_listen
        )
        cases = {c.id: c for c in (corpus.next() for _ in range(requests))}
        if only is not None:
            cases = {only: cases[only]}
        follower = EventFollower(s.gate.control)
        await follower.start()
        answers: dict[str, list[Answer]] = {}
        queue = list(cases.values())
        queue.reverse()
        started = time.monotonic()

        async def worker() -> None:
            while queue:
                case = queue.pop()
                report.kinds[case.kind] += 1
                try:
                    answers[case.id] = await exchange(_port(s, case.listener), case)
                except TimeoutError:
                    report.timeouts.append(f"case {case.id}: {case.raw[:160]!r}")
                    answers[case.id] = []

        await asyncio.gather(*(worker() for _ in range(CONCURRENCY)))
        report.seconds = time.monotonic() - started
        try:
            document = await eventually(
                s.gate.status, lambda d: d["leases"] == [] and d["queue"] == [], timeout=20
            )
        except AssertionError:
            document = await s.gate.status()
        report.leases_left = len(document["leases"])
        report.left_sample = [json.dumps(lease) for lease in document["leases"][:5]]
        report.tickets_left = len(document["queue"])
        await follower.stop()
        report.events_dropped = follower.dropped
        judge(report, cases, answers, s, follower.grants)
        left = {str(lease["id"]) for lease in document["leases"]}
        for case_id, got in answers.items():
            for answer in got:
                if answer.lease in left:
                    report.left_sample.append(
                        f"lease {answer.lease} <- case {case_id}: {cases[case_id].raw[:300]!r}"
                    )
        lines = await asyncio.to_thread(s.gate.stderr_lines)
        report.tracebacks = sum(1 for line in lines if line.startswith("Traceback"))
        report.traceback_sample = [line for line in lines if "Error" in line][:10]
    return report, cases


def judge(
    report: Report,
    cases: dict[str, Case],
    answers: dict[str, list[Answer]],
    s: OracleStack,
    grants: dict[str, Grant],
) -> None:
    """Every reader's record against the gate's answers and grants."""
    forwarded: set[str] = set()
    records = read_records(s.ollama_records)
    report.readings = compare(records, read_readings(s.ollama_readings))
    for record in records:
        if not record.case:
            continue  # the gate's own calls: listings, sizes, unloads
        forwarded.add(record.case)
        case_id = record.case
        answer = _answer_for(case_id, answers)
        if record.undecided:
            report.undecided += 1
        elif record.could_load:
            report.loads_read += 1
            grant = grants.get(answer.lease or "") if answer is not None else None
            if grant is None:
                report.bypasses.append(f"case {case_id} loads {record.model} without a lease")
            elif grant.model != record.model:
                report.bypasses.append(
                    f"case {case_id} loads {record.model} under a lease for {grant.model}"
                )
            elif grant.wall > record.t + 0.002:
                report.bypasses.append(f"case {case_id} reached Ollama before its grant")
            if record.after_load and answer is not None and answer.failure in LOAD_FAILURES:
                report.mislabelled.append(
                    f"case {case_id}: {answer.status} {answer.failure} for {record.after_load!r}"
                )
        else:
            report.refusals_read += 1
            report.reasons[record.reason.split(":")[0].split(" ")[0]] += 1
            if answer is not None and _admitted(answer):
                report.wrongful.append(f"case {case_id}: Ollama refuses it ({record.reason})")
    for prompt in read_prompt_records(s.prompt_records):
        if not prompt.case:
            continue
        forwarded.add(prompt.case)
        answer = _answer_for(prompt.case, answers)
        if prompt.queued:
            report.prompts_queued += 1
            if answer is None or answer.lease is None or answer.lease not in grants:
                report.bypasses.append(f"case {prompt.case}: ComfyUI queued it without a lease")
        else:
            report.prompts_refused += 1
            if answer is not None and _admitted(answer):
                report.wrongful.append(f"case {prompt.case}: ComfyUI refused it ({prompt.status})")
    for whisper in read_whisper_records(s.whisper_records):
        if not whisper.case:
            continue
        forwarded.add(whisper.case)
        answer = _answer_for(whisper.case, answers)
        if whisper.route is WhisperRoute.LOAD:
            report.whisper_loads += int(whisper.loaded)
            # A /load that switched models was a demand: its lease came first.
            if whisper.loaded and (answer is None or answer.lease not in grants):
                report.bypasses.append(
                    f"case {whisper.case}: whisper loaded {whisper.model} without a lease "
                    f"(answered {_said(answer)})"
                )
    for case_id, got in answers.items():
        for answer in got:
            key = f"{cases[case_id].listener.value} {answer.status}"
            report.outcomes[key + (f" {answer.failure}" if answer.failure else "")] += 1
            if answer.status is None or answer.status < 500:
                continue
            if answer.failure in CAPACITY_CLASSES or answer.failure in UPSTREAM_CLASSES:
                continue
            if case_id in forwarded or answer.body.startswith(RUNTIME_SHAPED):
                continue  # the runtime's own 5xx, or the gate's in its shape
            if cases[case_id].listener is Listener.CONTROL and answer.status == 503:
                continue  # health: the gate says it is not healthy, which it may be
            report.gate_5xx.append(
                f"case {case_id}: {answer.status} {answer.body[:80]!r} <- "
                f"{cases[case_id].raw[:160]!r}"
            )


def _answer_for(case_id: str, answers: dict[str, list[Answer]]) -> Answer | None:
    """The answer a record's case got: a smuggled or pipelined `Ns` is the second of N's."""
    if case_id.endswith("s"):
        got = answers.get(case_id[:-1], [])
        return got[1] if len(got) > 1 else None
    got = answers.get(case_id, [])
    return got[0] if got else None


def _said(answer: Answer | None) -> str:
    """An answer in a few words, for a failing case."""
    if answer is None:
        return "nothing"
    return f"{answer.status} {answer.failure or ''} lease {answer.lease}".strip()


def _admitted(answer: Answer) -> bool:
    """Whether the gate took a request as a demand: it leased it, or queued it for room."""
    return answer.lease is not None or answer.failure in CAPACITY_CLASSES


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.faults.oracle_fuzz", description=__doc__)
    parser.add_argument("--requests", type=int, default=50_000)
    parser.add_argument("--seed", type=int, default=20261202)
    parser.add_argument("--case", default=None, help="replay one case of the seed's corpus")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="gpugate-oracle-") as directory:
        report, _ = asyncio.run(run(args.requests, args.seed, Path(directory), only=args.case))
    print(report.table())
    problems = report.problems()
    for problem in problems:
        print("FAIL", problem)
    if problems:
        print(f"seed {args.seed}; replay a case with --seed {args.seed} --case ID")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
