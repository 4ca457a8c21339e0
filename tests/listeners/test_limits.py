"""No client connection can hold a listener: slow headers, slow bodies, idle keep-alives and
too many connections are each bounded, and the listener keeps serving everyone else."""

from __future__ import annotations

import asyncio
import json

import pytest

from tests.gate.harness import running_stack
from tests.listeners.wire import closed_by_peer, connect, drip, read_reply, request

TIMEOUTS = "limits: {header_timeout: 300ms, body_timeout: 300ms, idle_timeout: 300ms}\n"
DRIP = 0.2
"""Seconds between a slow client's bytes: its head or body takes far longer than BOUND."""
BOUND = 5.0
"""The most a 300 ms timeout may take to close a connection on a busy machine: well under
the drip's whole length, so a timeout restarted by each byte would not pass for one."""
CAPPED = "limits: {idle_timeout: 30s, max_connections: 5, max_connections_per_client: 5}\n"


@pytest.fixture
async def stack(tmp_path, sim_host, fakenvml_path):
    async with running_stack(tmp_path, sim_host, fakenvml_path, consumer_yaml=TIMEOUTS) as s:
        yield s


async def answered(url: str) -> int:
    reader, writer = await connect(url)
    try:
        writer.write(request("GET", "/api/version"))
        return (await read_reply(reader)).status
    finally:
        writer.close()


async def test_headers_sent_a_byte_at_a_time_are_dropped_after_header_timeout(stack):
    reader, writer = await connect(stack.gate_url)
    loop = asyncio.get_running_loop()
    started = loop.time()
    # The headers never end: only the header timeout can close this connection.
    slow = asyncio.create_task(drip(writer, request("GET", "/api/version")[:-2], DRIP))
    assert await answered(stack.gate_url) == 200
    assert await closed_by_peer(reader) == b""
    elapsed = loop.time() - started
    assert 0.25 < elapsed < BOUND, elapsed
    await slow
    writer.close()
    assert await answered(stack.gate_url) == 200


async def test_a_body_sent_a_byte_at_a_time_is_dropped_after_body_timeout(stack):
    body = json.dumps({"model": "llama3.2:3b", "prompt": "slow"}).encode()
    reader, writer = await connect(stack.gate_url)
    loop = asyncio.get_running_loop()
    writer.write(request("POST", "/api/generate", body)[: -len(body)])
    started = loop.time()
    slow = asyncio.create_task(drip(writer, body[:-1], DRIP))
    assert await answered(stack.gate_url) == 200
    assert await closed_by_peer(reader) == b""
    elapsed = loop.time() - started
    assert 0.25 < elapsed < BOUND, elapsed
    await slow
    writer.close()
    assert stack.gate.core.leases() == []
    assert stack.gate.core.waiting() == []
    assert await answered(stack.gate_url) == 200


async def test_an_idle_keep_alive_connection_is_closed_after_idle_timeout(stack):
    reader, writer = await connect(stack.gate_url)
    loop = asyncio.get_running_loop()
    writer.write(request("GET", "/api/version"))
    reply = await read_reply(reader)
    assert reply.status == 200 and reply.headers.get("connection") != "close"
    idle_from = loop.time()
    assert await closed_by_peer(reader) == b""
    elapsed = loop.time() - idle_from
    assert 0.25 < elapsed < BOUND, elapsed
    writer.close()


async def test_the_connection_over_max_connections_gets_503_and_the_others_keep_working(
    tmp_path, sim_host, fakenvml_path
):
    async with running_stack(tmp_path, sim_host, fakenvml_path, consumer_yaml=CAPPED) as stack:
        five = [await connect(stack.gate_url) for _ in range(5)]
        for reader, writer in five:
            writer.write(request("GET", "/api/version"))
            assert (await read_reply(reader)).status == 200
        # Each has a request in flight (its body still to come): none can be reclaimed.
        for _, writer in five:
            writer.write(request("POST", "/api/show", b"{}")[:-2])
        reader, writer = await connect(stack.gate_url)
        writer.write(request("GET", "/api/version"))
        refused = await read_reply(reader)
        assert refused.status == 503
        assert refused.headers["connection"] == "close"
        assert refused.body == b"gpugate: too many connections to this listener; try again later\n"
        assert await closed_by_peer(reader) == b""
        writer.close()
        for reader, writer in five:
            writer.write(b"{}")
            assert (await read_reply(reader)).status == 400  # Ollama: "model is required"
        # One of the five leaves: its slot is free again.
        five[0][1].close()
        await closed_by_peer(five[0][0])
        await asyncio.wait_for(_until_accepting(stack.gate_url), 5)
        for _, writer in five[1:]:
            writer.close()


async def _until_accepting(url: str) -> None:
    # The gate learns of the close when the loop next reads that socket.
    while True:
        reader, writer = await connect(url)
        writer.write(request("GET", "/api/version"))
        status = (await read_reply(reader)).status
        writer.close()
        if status == 200:
            return


@pytest.mark.parametrize("method", ["FOO", "BREW"])
async def test_a_method_no_parser_knows_goes_to_the_runtime_as_go_hands_it_on(
    stack, method, caplog
):
    # Go's net/http reads any token as a method and hands it to Ollama's router (gin's 405
    # is the runtime's answer): the gate relays it, writing nothing of its own. The
    # simulated Ollama runs on aiohttp, whose parser refuses such a method with a 400.
    for _ in range(2):
        reader, writer = await connect(stack.gate_url)
        writer.write(request("GET", "/api/version"))
        first = await read_reply(reader)
        writer.write(request(method, "/api/tags"))
        second = await read_reply(reader)
        writer.close()
        assert first.status == 200
        assert second.status == 400
        assert b"Invalid method encountered" in second.body  # the simulator's parser's answer
        assert not [name for name in second.headers if name.lower().startswith("x-gpugate")]
    assert not [r for r in caplog.records if r.exc_info and r.name.startswith("gpugate")]
    assert stack.gate.core.leases() == []
    assert await answered(stack.gate_url) == 200


@pytest.mark.parametrize(
    "raw",
    [
        b"GET /\x01bad HTTP/1.1\r\nHost: localhost\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: localhost\r\nBad Header\r\n\r\n",
        b"GET / HTTP/9.9.9\r\nHost: localhost\r\n\r\n",
    ],
)
async def test_a_request_the_parser_refuses_gets_a_plain_400_and_no_traceback(stack, raw, caplog):
    for _ in range(2):  # aiohttp logs a traceback only from a connection's second request on
        reader, writer = await connect(stack.gate_url)
        writer.write(request("GET", "/api/version"))
        first = await read_reply(reader)
        writer.write(raw)
        second = await read_reply(reader)
        writer.close()
        assert first.status == 200
        assert (second.status, second.body) == (400, b"400 Bad Request")
    assert "Traceback" not in caplog.text
    assert await answered(stack.gate_url) == 200


async def test_a_gzip_body_goes_up_as_the_client_encoded_it(stack):
    # Ollama (Go) does not decode a request's Content-Encoding: its JSON decoder sees the
    # bytes as sent and answers 400. The gate must neither decode nor fail on them.
    body = b"not gzip at all"
    reader, writer = await connect(stack.gate_url)
    writer.write(
        request(
            "POST", "/api/generate", body, Content_Encoding="gzip", Content_Type="application/json"
        )
    )
    through_gate = await read_reply(reader)
    writer.close()
    reader, writer = await connect(stack.sim_url)
    writer.write(
        request(
            "POST", "/api/generate", body, Content_Encoding="gzip", Content_Type="application/json"
        )
    )
    direct = await read_reply(reader)
    writer.close()
    assert through_gate.status == direct.status == 400
    assert through_gate.body == direct.body
    assert stack.gate.core.leases() == []
