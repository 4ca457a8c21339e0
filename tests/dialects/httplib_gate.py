"""Corpus B through the gate: each case of corpus_httplib.py sent to a real cpp-httplib
server (llama-server, whisper-server) and to the gate in front of it, compared as
through_gate.py compares (`classify`), counted per class.

The gate is a consumer of the server already running (no control: a llama-server router
consumer, an unobserved whisper consumer), so every request the gate does not answer itself
goes up to the same process the direct exchange reaches.
"""

from __future__ import annotations

import asyncio
import collections
import os
from pathlib import Path

from gpugate.runtimes.sections import load_config_text
from tests.dialects.corpus_httplib import corpus
from tests.dialects.harness import Outcome as HarnessOutcome
from tests.dialects.harness import complete_answers, exchange, normalise
from tests.dialects.through_gate import Difference, classify, exchange_open
from tests.dialects.wire import Outcome
from tests.ports import free_ports
from tests.serving import GATE_PREAMBLE, serving

SECONDS = 12.0
"""Seconds one exchange may take before it counts as stalled: more than cpp-httplib's own
5-second read and keep-alive timeouts, so a stall is the gate's, never the server's."""

CONFIG = (
    GATE_PREAMBLE
    + """\
  {name}:
    runtime: {runtime}
    listen: 127.0.0.1:{listen}
    upstream: http://127.0.0.1:{upstream}
    class: interactive
    residency: {{policy: keep_warm, ttl: 15m}}
    processes: {{commands: [{runtime}]}}
"""
)


SHOW = bool(os.environ.get("GPUGATE_SHOW_DIFFERENCES"))
"""Print each case that differs, and the names per class (as test_through_gate.py does)."""


def show(found: dict[Difference, list[str]]) -> None:
    if SHOW:
        for kind, names in found.items():
            print(kind, len(names), names)


PIPELINED = {
    "pipelined get": b"GET /health HTTP/1.1\r\nHost: h\r\n\r\n",
    "pipelined post": b"POST /health HTTP/1.1\r\nHost: h\r\nContent-Length: 3\r\n\r\nabc",
    "pipelined chunked": b"POST /health HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked"
    b"\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
}
"""Requests written with a second request and a closing probe behind them in one write
(through_gate.py `exchange_open`): cpp-httplib reads them all with the first and drops
what follows it (dialects/httplib.py `drops_read_ahead`), so one answer comes, and the
connection waits for a request that never comes."""
PIPELINE_WAIT = 1.0
"""Seconds of silence after which such a connection counts as left open (both servers
wait 5 s for a next request)."""

ONE_BY_ONE = 101
"""Requests sent on one connection, each after the answer before it: one more than
cpp-httplib serves on a connection (CPPHTTPLIB_KEEPALIVE_MAX_COUNT)."""


async def one_by_one(port: int, count: int) -> HarnessOutcome:
    """`count` GET /health on one connection, each sent once the answer before it came,
    until the server closes; every answer read, and whether it closed."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    data = b""
    try:
        for _ in range(count):
            try:
                writer.write(b"GET /health HTTP/1.1\r\nHost: h\r\n\r\n")
                await writer.drain()
            except ConnectionError:
                return HarnessOutcome(normalise(data), closed=True)
            want = complete_answers(data)[0] + 1
            while complete_answers(data)[0] < want:
                try:
                    chunk = await asyncio.wait_for(reader.read(65536), SECONDS)
                except ConnectionError:
                    chunk = b""
                if not chunk:
                    return HarnessOutcome(normalise(data), closed=True)
                data += chunk
        return HarnessOutcome(normalise(data), closed=False)
    finally:
        writer.close()


def as_outcome(outcome: HarnessOutcome) -> Outcome:
    """through_gate.py's outcome: a stall (neither answered nor closed in time) is its own end."""
    ended = "stalled" if outcome.stalled else "closed" if outcome.closed else "open"
    return Outcome(outcome.data, ended)


async def through_gate(
    runtime: str,
    upstream: int,
    directory: Path,
    library: Path,
    paths: list[str],
    get_only: list[str],
    *,
    whisper: bool,
) -> tuple[dict[Difference, list[str]], list[str]]:
    """Every case of the corpus to the server and to the gate: the case names per class,
    and those of the same cases whose bytes differ (`classify` compares header fields as
    a set, less `Date`)."""
    control, listen = free_ports(2)
    text = CONFIG.format(
        control=control,
        library=library,
        name=runtime.replace("-", ""),
        runtime=runtime,
        listen=listen,
        upstream=upstream,
    )
    found: dict[Difference, list[str]] = collections.defaultdict(list)
    reordered: list[str] = []
    async with serving(load_config_text(text, directory / "consumers.yaml")) as served:
        for case in corpus(paths, get_only, whisper=whisper):
            direct = await exchange("127.0.0.1", upstream, case, seconds=SECONDS)
            gated = await exchange("127.0.0.1", listen, case, seconds=SECONDS)
            kind = classify(as_outcome(direct), as_outcome(gated))
            found[kind].append(case.name)
            if kind is Difference.SAME and direct.data != gated.data:
                reordered.append(case.name)
            if SHOW and kind is not Difference.SAME:
                print(f"--- {case.name}: {kind}\n direct {direct}\n gated  {gated}")
        for name, data in PIPELINED.items():
            data += b"GET /health HTTP/1.1\r\nHost: h\r\n\r\n"
            alike = []
            for port in (upstream, listen):
                address = ("127.0.0.1", port)
                alike.append(await asyncio.to_thread(exchange_open, address, data, PIPELINE_WAIT))
            kind = classify(*alike)
            found[kind].append(name)
            if kind is Difference.SAME and alike[0].data != alike[1].data:
                reordered.append(name)
        name = f"{ONE_BY_ONE} requests one by one"
        direct = await one_by_one(upstream, ONE_BY_ONE)
        gated = await one_by_one(listen, ONE_BY_ONE)
        kind = classify(as_outcome(direct), as_outcome(gated))
        found[kind].append(name)
        if kind is Difference.SAME and direct.data != gated.data:
            reordered.append(name)
        assert served.gate.core.leases() == []
    return found, reordered
