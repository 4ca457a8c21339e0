"""Fuzz the gate in front of the real runtimes: `python -m tests.faults.real_fuzz --requests N
--seed S`.

Behind the gate: the real whisper-server (build/whisper-server, the CPU build; the gate
starts it, and tests/whisper/gated.py shows it on the simulated card) and the real
llama-server in router mode (build/llama-server over three tiny models). A hostile corpus
(tests.faults.realgen) goes through the gate one case at a time. Each runtime's own log
says what it loaded: whisper-server's `loading model from '...'` (printed at its start and
for every /load that passed its checks: the old model is freed by then), the router's
`spawning server instance with name=...`. Checked, for every case: every load the runtime
logged while the case ran was leased, during the case, for that very model; a load with no
such lease is an unleased switch. After each whisper case a transcription sent to the
server directly (it takes the server's one mutex) lets any /load under way finish first.
For the router also: the models it holds after each case (its `GET /models`: loaded or
loading) are the ones the gate's books hold, and it unloaded none of its own accord at
`--models-max` (its log's `removing LRU` and `evicting idle LRU`): the gate made the room.

Prints a table; exits 1 when anything loaded unleased.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import attrs
import httptools

from gpugate.core.effects import EventKind
from gpugate.core.failures import FailureClass
from gpugate.core.residents import ResidentState
from gpugate.core.units import GiB, MiB
from gpugate_sim.device import SimDevice, SimulatedGpuHost
from gpugate_sim.shim import STATE_ENV
from gpugate_sim.whisper.transcript import wav_bytes
from tests.faults.realgen import ROUTER_MODELS, Case, Corpus, Target
from tests.llamaserver.gguf_models import write_models_dir
from tests.ports import free_port
from tests.whisper.conftest import Models
from tests.whisper.gated import Gated, gate_before
from tests.whisper.ggml_models import write_english, write_multilingual
from tests.whisper.wire import form, form_type, part, request

ROOT = Path(__file__).resolve().parents[2]
WHISPER = ROOT / "build" / "whisper-server"
LLAMA = ROOT / "build" / "llama-server"
LIBRARY = ROOT / "build" / "fakenvml" / "libnvidia-ml.so.1"
ANSWER_TIMEOUT = 120.0
SPAWNING = "load: spawning server instance with name="
ROUTER_EVICTS = ("models_max limit reached, removing LRU", "evicting idle LRU name=")
"""The router's own unloads at --models-max (server-models.cpp `unload_lru`, `tick`)."""

ROUTER_YAML = """\
  llama:
    runtime: llama-server
    listen: 127.0.0.1:{listen}
    upstream: http://127.0.0.1:{upstream}
    class: interactive
    residency: {{policy: keep_warm, ttl: 15m}}
    processes: {{commands: [llama-server]}}
"""


@attrs.define
class Report:
    requests: int
    seed: int
    kinds: Counter[str] = attrs.field(factory=Counter)
    answers: Counter[str] = attrs.field(factory=Counter)
    whisper_loads: int = 0
    router_loads: int = 0
    unleased: list[str] = attrs.field(factory=list)
    router_evictions: int = 0
    """Models the router unloaded of its own accord."""
    gate_evictions: int = 0
    """Models the gate unloaded from the router (room made at --models-max)."""
    whisper_ends: int = 0
    """whisper-server's exits on a /load of a file that does not load (ended switching)."""
    crashes: int = 0
    """RUNTIME_CRASH events for whisper-server."""
    books_differ: list[str] = attrs.field(factory=list)
    """Cases after which the router held other models than the gate's books."""
    seconds: float = 0.0

    @property
    def failed(self) -> bool:
        return bool(self.unleased or self.books_differ or self.router_evictions)

    def table(self) -> str:
        rows = [
            ("requests", str(self.requests)),
            ("seed", str(self.seed)),
            ("seconds", f"{self.seconds:.1f}"),
            ("whisper-server loads (its starts and switches)", str(self.whisper_loads)),
            ("whisper-server exits on a model that did not load", str(self.whisper_ends)),
            ("whisper-server crashes reported", str(self.crashes)),
            ("llama-server router loads", str(self.router_loads)),
            ("loads without their lease", str(len(self.unleased))),
            ("router models the gate unloaded to make room", str(self.gate_evictions)),
            ("router unloads of its own accord", str(self.router_evictions)),
            ("router cases its books disagree with", str(len(self.books_differ))),
        ]
        rows += [(f"  {k}", str(v)) for k, v in sorted(self.answers.items())]
        width = max(len(k) for k, _ in rows)
        return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


def write_models(directory: Path) -> Models:
    garbage = directory / "garbage.bin"
    garbage.write_bytes(b"not a ggml model\n" * 8)
    folder = directory / "folder.bin"
    folder.mkdir()
    return Models(
        english=write_english(directory / "ggml-tiny.en.bin", seed=1),
        english_other=write_english(directory / "ggml-other.en.bin", seed=2),
        multilingual=write_multilingual(directory / "ggml-tiny.bin", seed=3),
        not_a_model=garbage,
        directory=folder,
        missing=directory / "missing.bin",
    )


@contextlib.contextmanager
def running_router(directory: Path, log: Path) -> Iterator[int]:
    """The real llama-server in router mode over three tiny models; its port."""
    models = directory / "gguf"
    write_models_dir(models, ROUTER_MODELS)
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LLAMA_", "HF_"))}
    env["LLAMA_CACHE"] = str(directory / "llama-cache")
    argv = [str(LLAMA), "--models-dir", str(models), "--models-max", "2", "--host", "127.0.0.1",
            "--port", str(port), "-t", "1", "-tb", "1", "-c", "512", "-np", "1"]  # fmt: skip
    with log.open("wb") as out:
        proc = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=env,
            start_new_session=True,
        )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while b"HTTP/1.1 200" not in _get(port, "/health"):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"llama-server router did not start: {log.read_text()[-2000:]}")
            time.sleep(0.05)
        yield port
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, 9)
        proc.wait()


def _get(port: int, path: str) -> bytes:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
            sock.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
            return sock.recv(64)
    except OSError:
        return b""


class _Answers:
    """llhttp callbacks: the status of each whole answer read off a connection."""

    def __init__(self) -> None:
        self.statuses: list[int] = []
        self.parser = httptools.HttpResponseParser(self)

    def on_message_complete(self) -> None:
        self.statuses.append(self.parser.get_status_code())

    def final(self) -> int | None:
        return next((s for s in self.statuses if s >= 200), None)


async def exchange(port: int, raw: bytes) -> str:
    """Send a case; its answer's status (after any 100 Continue), or how it ended."""
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
    except OSError as exc:
        return f"no connection ({type(exc).__name__})"
    answers = _Answers()
    try:
        writer.write(raw)
        await writer.drain()
        async with asyncio.timeout(ANSWER_TIMEOUT):
            while answers.final() is None:
                data = await reader.read(65536)
                if not data:
                    with contextlib.suppress(httptools.HttpParserError):
                        answers.parser.feed_data(b"")
                    break
                answers.parser.feed_data(data)
    except (ConnectionError, httptools.HttpParserError):
        pass
    finally:
        writer.close()
    status = answers.final()
    return "closed" if status is None else str(status)


async def settle_whisper(upstream: int) -> None:
    """A transcription straight to the server: it runs once no /load holds the mutex."""
    audio = part("file", wav_bytes(0.2), disposition=b'form-data; name="file"; filename="a.wav"')
    raw = request("POST", "/inference", form(audio), content_type=form_type())
    await exchange(upstream, raw)


async def router_statuses(port: int) -> dict[str, str]:
    """Each model's status in the router's `GET /models`."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(b"GET /models HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        data = await reader.read()
    finally:
        writer.close()
    body = data.split(b"\r\n\r\n", 1)[-1]
    try:
        rows = json.loads(body)["data"]
    except (ValueError, KeyError):
        rows = []
    return {str(row.get("id")): str(row.get("status", {}).get("value")) for row in rows}


async def settle_router(port: int) -> dict[str, str]:
    """Wait until the router loads nothing (`/models/load` answers before its load ends);
    its statuses then."""
    deadline = time.monotonic() + ANSWER_TIMEOUT
    while True:
        statuses = await router_statuses(port)
        if "loading" not in statuses.values() or time.monotonic() > deadline:
            return statuses
        await asyncio.sleep(0.02)


def router_books(gated: Gated) -> set[str]:
    """The models of consumer `llama` the gate's books hold (loading or resident)."""
    held = (ResidentState.RESIDENT, ResidentState.LOADING)
    return {
        r.key.model
        for r in gated.gate.core.residents()
        if r.key.consumer == "llama" and r.state in held
    }


def router_evictions(log: Path) -> int:
    if not log.exists():
        return 0
    text = log.read_text(errors="replace")
    return sum(text.count(line) for line in ROUTER_EVICTS)


def router_loads(log: Path) -> list[str]:
    if not log.exists():
        return []
    found = []
    for line in log.read_text(errors="replace").splitlines():
        if SPAWNING in line:
            found.append(line.split(SPAWNING, 1)[1].split(" on port ")[0])
    return found


async def run_cases(
    gated: Gated, routers: tuple[int, int], router_log: Path, cases: list[Case], report: Report
) -> None:
    router_listen, router_port = routers
    for case in cases:
        report.kinds[case.kind] += 1
        whisper_before, router_before = len(gated.loads()), len(router_loads(router_log))
        events_before = len(gated.events)
        port = gated.port if case.target is Target.WHISPER else router_listen
        status = await exchange(port, case.raw)
        report.answers[f"{case.target.value} {status}"] += 1
        if case.target is Target.WHISPER:
            await settle_whisper(gated.upstream)
        else:
            statuses = await settle_router(router_port)
            held = {name for name, value in statuses.items() if value in ("loaded", "loading")}
            books = router_books(gated)
            if held != books:
                report.books_differ.append(
                    f"case {case.id} ({case.kind}): the router holds {sorted(held)}, the "
                    f"books {sorted(books)} (answered {status}): {case.raw[:200]!r}"
                )
        new_events = gated.events[events_before:]
        for consumer, loaded in (
            ("whisper", gated.loads()[whisper_before:]),
            ("llama", router_loads(router_log)[router_before:]),
        ):
            leased = Counter(
                e.key.model
                for e in new_events
                if e.kind is EventKind.LEASE_GRANTED and e.key and e.key.consumer == consumer
            )
            for model in loaded:
                if leased[model] > 0:
                    leased[model] -= 1
                else:
                    report.unleased.append(
                        f"case {case.id} ({case.kind}): {consumer} loaded {model!r} unleased "
                        f"(answered {status}): {case.raw[:200]!r}"
                    )
            if consumer == "whisper":
                report.whisper_loads += len(loaded)
            else:
                report.router_loads += len(loaded)


async def run(requests: int, seed: int, directory: Path, *, router: float = 0.2) -> Report:
    """Start the stack in `directory`, send `requests` cases (`router`: the share for the
    llama-server router, the rest for whisper-server), judge each."""
    report = Report(requests, seed)
    host = SimulatedGpuHost.create(
        directory / "gpu", [SimDevice(0, 16 * GiB, 434 * MiB, "GPU-real-fuzz", "sim")]
    )
    os.environ[STATE_ENV] = str(host.state_path)
    models_dir = directory / "ggml"
    models_dir.mkdir()
    models = write_models(models_dir)
    router_log = directory / "router.log"
    with contextlib.ExitStack() as stack:
        # The router only when some cases are for it (a port nothing answers, else).
        router_port = stack.enter_context(running_router(directory, router_log)) if router else 0
        router_listen = free_port()
        extra = ROUTER_YAML.format(listen=router_listen, upstream=router_port or free_port())
        async with gate_before(WHISPER, models, directory, host, LIBRARY, extra=extra) as gated:
            corpus = Corpus(random.Random(seed), models, gated.upstream, router=router)
            cases = [corpus.next() for _ in range(requests)]
            started = time.monotonic()
            await run_cases(gated, (router_listen, router_port), router_log, cases, report)
            report.seconds = time.monotonic() - started
            for event in gated.events:
                if event.kind is EventKind.EVICTION_STARTED and event.consumer == "llama":
                    report.gate_evictions += 1
                if event.consumer != "whisper":
                    continue
                if event.kind is EventKind.LIFECYCLE and "ended switching" in (event.detail or ""):
                    report.whisper_ends += 1
                failure = event.failure if event.kind is EventKind.FAILURE else None
                if failure is not None and failure.failure_class is FailureClass.RUNTIME_CRASH:
                    report.crashes += 1
        report.router_evictions = router_evictions(router_log)
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.faults.real_fuzz", description=__doc__)
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=20261203)
    parser.add_argument("--router", type=float, default=0.2, help="share of router cases")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="gpugate-real-") as directory:
        report = asyncio.run(run(args.requests, args.seed, Path(directory), router=args.router))
    print(report.table())
    for problem in [*report.unleased, *report.books_differ][:20]:
        print("FAIL", problem)
    return 1 if report.failed else 0


if __name__ == "__main__":
    sys.exit(main())
