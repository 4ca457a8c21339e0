"""The dialect corpora through the gate: what a client sees of the gate in front of a server
against what it sees of that server directly.

Go's net/http: the gate's listener as an Ollama consumer in front of the Go echo oracle
(build/nethttp/nethttp-echo); every case of corpus_go.py goes to both, twice: sent and
half-closed, as the dialect tests send it, and sent with a closing probe on a connection
kept open. The outcomes are compared as through_gate.py says and each case is given its
`Difference`; the counts per class are asserted as measured (docs/reliability.md lists
what each class holds and why), so a change that adds or removes a difference fails here.
aiohttp's server with ComfyUI's settings: the gate as a ComfyUI consumer in front of
tests/dialects/aiohttp_reference.py, every case of corpus_aiohttp.py sent to both as that
corpus's harness sends it, compared and counted the same way.
"""

from __future__ import annotations

import asyncio
import collections
import os

import pytest

from gpugate.runtimes.sections import load_config_text
from tests.dialects import aiohttp_reference, harness
from tests.dialects.corpus_aiohttp import corpus
from tests.dialects.corpus_go import cases
from tests.dialects.through_gate import Difference, classify, exchange_open
from tests.dialects.wire import Outcome, exchange
from tests.gate.harness import running_stack
from tests.ports import free_ports
from tests.serving import GATE_PREAMBLE, serving

GATE_TIMEOUT = 20.0
"""Seconds a gate's answer may take before the connection counts as left open."""

OPEN_TIMEOUT = 3.0
"""Seconds a connection kept open may stay quiet before it counts as left open: only a
case that leaves a server waiting for more of it (an unfinished head or body) waits it."""

GO_KEPT_OPEN = {
    Difference.SAME: 577,
    Difference.HANDLER_RULES: 74,
    Difference.GATE_ANSWERED: 50,
    Difference.STATUS: 2,
}
"""Measured: cases of corpus_go.py per class, sent with a closing probe on a connection
kept open (docs/reliability.md, "Through the gate"), against the echo built with Go 1.26.0
(the runtime's toolchain): a `Trailer` of 501 names is served there (Go 1.27 answers 431),
so the gate answers that POST for Ollama's handler; the absolute targets whose host Ollama's
Host check refuses (`http://a[::1]/` names `[::1]`, `postgres://a:1:2/`) are answered 403,
and the trailers with raw bytes in textproto's error get Ollama's answer to a bad body."""
COMFY_EXPECTED = {Difference.SAME: 584}
"""Measured: cases of corpus_aiohttp.py per class through a ComfyUI consumer in front of
aiohttp's server with ComfyUI's settings (tests/dialects/aiohttp_reference.py)."""
GO_HALF_CLOSED_RULES = 71
"""Half-closed, the cases the gate answers for Ollama's handler; every other case is the
same or unanswered (which of the two depends on whether the client's end reaches the gate
before the runtime's answer, so only their sum is fixed)."""


async def _run(
    oracle: tuple[str, int], gate: tuple[str, int], *, half_close: bool
) -> dict[Difference, list[str]]:
    found: dict[Difference, list[str]] = collections.defaultdict(list)
    for case in cases():
        # Ollama's own Host check (a handler's rule, which the echo oracle lacks) refuses
        # the corpus's `Host: x`: the gate is sent a Host Ollama serves, and so is the oracle.
        data = case.data.replace(b"\r\nHost: x\r\n", b"\r\nHost: localhost:11434\r\n")
        if half_close:
            direct = await asyncio.to_thread(exchange, oracle, data)
            gated = await asyncio.to_thread(exchange, gate, data, GATE_TIMEOUT)
        else:
            direct = await asyncio.to_thread(exchange_open, oracle, data, OPEN_TIMEOUT)
            gated = await asyncio.to_thread(exchange_open, gate, data, OPEN_TIMEOUT)
        found[classify(direct, gated)].append(case.name)
    return found


@pytest.mark.parametrize("half_close", [True, False], ids=["half-closed", "kept-open"])
async def test_go_corpus_through_the_gate(tmp_path, sim_host, fakenvml_path, oracle, half_close):
    upstream = f"http://{oracle[0]}:{oracle[1]}"
    async with running_stack(tmp_path, sim_host, fakenvml_path, upstream=upstream) as stack:
        host, _, port = stack.gate_url.removeprefix("http://").rpartition(":")
        found = await _run(oracle, (host, int(port)), half_close=half_close)
        assert stack.gate.core.leases() == []
    counts = {kind: len(names) for kind, names in found.items()}
    if os.environ.get("GPUGATE_SHOW_DIFFERENCES"):
        for kind, names in found.items():
            print(kind, len(names), names)
    if not half_close:
        assert counts == GO_KEPT_OPEN
        return
    assert counts.pop(Difference.HANDLER_RULES) == GO_HALF_CLOSED_RULES
    assert set(counts) <= {Difference.SAME, Difference.UNANSWERED}
    assert sum(counts.values()) == len(cases()) - GO_HALF_CLOSED_RULES


COMFY_CONFIG = (
    GATE_PREAMBLE
    + """\
  comfyui:
    runtime: comfyui
    listen: 127.0.0.1:{listen}
    upstream: http://127.0.0.1:{upstream}
    class: interactive
    residency: {{policy: keep_warm, ttl: 15m}}
    processes: {{commands: [ComfyUI/main.py]}}
    working_set: 0
    working_set_per_megapixel: 1GiB
"""
)


def _as_outcome(outcome: harness.Outcome) -> Outcome:
    return Outcome(outcome.data, "closed" if outcome.closed else "open")


async def test_aiohttp_corpus_through_the_gate(tmp_path, sim_host, fakenvml_path):
    async with aiohttp_reference.running() as upstream:
        control, listen = free_ports(2)
        text = COMFY_CONFIG.format(
            control=control, library=fakenvml_path, listen=listen, upstream=upstream
        )
        found: dict[Difference, list[str]] = collections.defaultdict(list)
        async with serving(load_config_text(text, tmp_path / "consumers.yaml")) as served:
            for case in corpus():
                direct = await harness.exchange("127.0.0.1", upstream, case)
                gated = await harness.exchange("127.0.0.1", listen, case)
                found[classify(_as_outcome(direct), _as_outcome(gated))].append(case.name)
            assert served.gate.core.leases() == []
    counts = {kind: len(names) for kind, names in found.items()}
    if os.environ.get("GPUGATE_SHOW_DIFFERENCES"):
        for kind, names in found.items():
            print(kind, len(names), names)
    assert counts == COMFY_EXPECTED
