"""Rules of Go's net/http the gate keeps for Ollama, checked byte for byte against the Go
echo oracle (build/nethttp/nethttp-echo) behind the gate and directly: a successful
CONNECT's answer (framed, the connection kept: Go 1.26), 2,000 header lines (no count in
Go 1.26), an absolute-form
target as the runtime's `RequestURI`, and the origin form where the runtime behind the
gate would refuse the host such a target names."""

from __future__ import annotations

import asyncio

from gpugate.proxy.dialects.go import READ_LIMIT
from tests.dialects.through_gate import answers, exchange_open
from tests.gate.harness import running_stack

TIMEOUT = 3.0
"""Seconds a connection may stay quiet before it counts as left open."""


def _gate(url: str) -> tuple[str, int]:
    host, _, port = url.removeprefix("http://").rpartition(":")
    return ("127.0.0.1" if host == "0.0.0.0" else host, int(port))


def _echo_lines(data: bytes) -> list[bytes]:
    """The method and target lines of the echo's (first) answer."""
    (answer,) = answers(data)[:1]
    return [line for line in answer.body.split(b"\n") if line.startswith((b"method", b"target"))]


async def test_a_connect_is_answered_framed_and_the_connection_kept_as_gos_server_does(
    tmp_path, sim_host, fakenvml_path, oracle
):
    # Go 1.26.0 (the runtime's) serves a CONNECT as any request; Go 1.27 would send a
    # successful one unframed and close after it
    data = b"CONNECT localhost:11434 HTTP/1.1\r\nHost: localhost:11434\r\n\r\n"
    upstream = f"http://{oracle[0]}:{oracle[1]}"
    async with running_stack(tmp_path, sim_host, fakenvml_path, upstream=upstream) as stack:
        gated = await asyncio.to_thread(exchange_open, _gate(stack.gate_url), data, TIMEOUT)
    direct = await asyncio.to_thread(exchange_open, oracle, data, TIMEOUT)
    for outcome in (direct, gated):
        got = answers(outcome.data)
        assert [a.status for a in got] == [b"HTTP/1.1 200 OK"] * 2
        assert ("Content-Length", str(len(got[0].body))) in got[0].fields
        assert got[0].body.startswith(b'method "CONNECT"\ntarget "localhost:11434"\n')
        assert got[1].body.startswith(b'method "GET"\ntarget "/probe"\n')  # the closing probe
        assert outcome.ended == "closed"


async def test_2000_header_lines_are_served_through_the_gate_as_go_serves_them(
    tmp_path, sim_host, fakenvml_path, oracle
):
    # Go 1.26.0 counts no header lines (Go 1.27's DefaultMaxHeaderValueCount is 500)
    fields = b"".join(b"X-%d: %d\r\n" % (i, i) for i in range(2_000))
    data = b"GET /api/version HTTP/1.1\r\nHost: localhost:11434\r\n" + fields + b"\r\n"
    upstream = f"http://{oracle[0]}:{oracle[1]}"
    async with running_stack(tmp_path, sim_host, fakenvml_path, upstream=upstream) as stack:
        gated = await asyncio.to_thread(exchange_open, _gate(stack.gate_url), data, TIMEOUT)
    direct = await asyncio.to_thread(exchange_open, oracle, data, TIMEOUT)
    # through the gate, the runtime reads one more: the gate's X-Forwarded-For
    for outcome, count in ((direct, b"headers 2000"), (gated, b"headers 2001")):
        answer, probe = answers(outcome.data)
        assert (answer.status, probe.status) == (b"HTTP/1.1 200 OK", b"HTTP/1.1 200 OK")
        assert count in answer.body.split(b"\n"), answer.body


async def test_an_absolute_form_target_goes_up_as_sent(tmp_path, sim_host, fakenvml_path, oracle):
    data = b"GET http://localhost:11434/api/version HTTP/1.1\r\nHost: localhost:11434\r\n\r\n"
    upstream = f"http://{oracle[0]}:{oracle[1]}"
    async with running_stack(tmp_path, sim_host, fakenvml_path, upstream=upstream) as stack:
        gated = await asyncio.to_thread(exchange_open, _gate(stack.gate_url), data, TIMEOUT)
    direct = await asyncio.to_thread(exchange_open, oracle, data, TIMEOUT)
    want = [b'method "GET"', b'target "http://localhost:11434/api/version"']
    assert _echo_lines(direct.data) == want
    assert _echo_lines(gated.data) == want


async def test_a_target_naming_a_host_the_runtime_behind_would_refuse_goes_in_origin_form(
    tmp_path, sim_host, fakenvml_path, oracle
):
    # A listener that is not loopback checks no Host, as Ollama there would not; the
    # loopback runtime behind it would check the host Go takes from the target.
    data = b"GET http://evil.example/api/version HTTP/1.1\r\nHost: localhost:11434\r\n\r\n"
    upstream = f"http://{oracle[0]}:{oracle[1]}"
    async with running_stack(
        tmp_path, sim_host, fakenvml_path, upstream=upstream, listen_host="0.0.0.0"
    ) as stack:
        gated = await asyncio.to_thread(exchange_open, _gate(stack.gate_url), data, TIMEOUT)
    assert _echo_lines(gated.data) == [b'method "GET"', b'target "/api/version"']


async def test_a_head_as_long_as_go_reads_is_served_through_the_gate(
    tmp_path, sim_host, fakenvml_path, oracle
):
    line = b"GET /api/version HTTP/1.1\r\nHost: localhost:11434\r\nX-Pad: "
    data = line + b"p" * (READ_LIMIT - len(line) - 4) + b"\r\n\r\n"
    assert len(data) == READ_LIMIT
    upstream = f"http://{oracle[0]}:{oracle[1]}"
    async with running_stack(tmp_path, sim_host, fakenvml_path, upstream=upstream) as stack:
        gated = await asyncio.to_thread(exchange_open, _gate(stack.gate_url), data, TIMEOUT)
    direct = await asyncio.to_thread(exchange_open, oracle, data, TIMEOUT)
    assert [a.status for a in answers(direct.data)][:1] == [b"HTTP/1.1 200 OK"]
    assert [a.status for a in answers(gated.data)][:1] == [b"HTTP/1.1 200 OK"]
