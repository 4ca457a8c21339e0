"""A streamed answer goes down as the runtime wrote it: its head byte for byte (less the
hops), framed by the gate, with the first body bytes in the same write when they came
with the head, and at once when the head came alone."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator

import pytest

from tests.gate.harness import running_stack
from tests.listeners.wire import READ_TIMEOUT, closed_by_peer, connect, read_reply

HEAD = (
    b"HTTP/1.1 200 OK\r\n"
    b"Content-Type: application/x-ndjson\r\n"
    b"X-Mixed-Case: One\r\n"
    b"Connection: keep-alive, X-Hop\r\n"
    b"X-Hop: nominated by Connection\r\n"
    b"Server: runtime/1.0\r\n"
    b"Transfer-Encoding: chunked\r\n\r\n"
)
GATE_HEAD = (
    b"HTTP/1.1 200 OK\r\n"
    b"Content-Type: application/x-ndjson\r\n"
    b"X-Mixed-Case: One\r\n"
    b"Server: runtime/1.0\r\n"
    b"Transfer-Encoding: chunked\r\n\r\n"
)
FIRST, REST = b'{"models":', b"[]}"
LONG = 300 * 1024
"""Past the size of an answer sent whole: relayed as it comes, with its own length."""


def chunk(data: bytes) -> bytes:
    return b"%x\r\n%b\r\n" % (len(data), data)


class Runtime:
    """Answers every request with `{"models":[]}` in two chunks, the first with the head
    (`/api/tags?alone`: the head alone, the body once `go` is set; `/api/tags?long`: a
    long body of known length, in parts)."""

    def __init__(self) -> None:
        self.go = asyncio.Event()
        self.server: asyncio.Server | None = None

    async def start(self) -> str:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
            while head := await reader.readuntil(b"\r\n\r\n"):
                target = head.split(b" ", 2)[1]
                if target.endswith(b"?long"):
                    writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % LONG)
                    for _ in range(LONG // 4096):
                        writer.write(b"x" * 4096)
                        await writer.drain()
                    continue
                if target.endswith(b"?alone"):
                    writer.write(HEAD)
                    await writer.drain()
                    await asyncio.wait_for(self.go.wait(), READ_TIMEOUT)
                    writer.write(chunk(FIRST))
                else:
                    writer.write(HEAD + chunk(FIRST))
                await writer.drain()
                await asyncio.sleep(0.02)
                writer.write(chunk(REST) + b"0\r\n\r\n")
                await writer.drain()
        writer.close()

    def close(self) -> None:
        if self.server is not None:
            self.server.close()


@pytest.fixture
async def runtime(tmp_path, sim_host, fakenvml_path) -> AsyncIterator[tuple[object, Runtime]]:
    upstream = Runtime()
    url = await upstream.start()
    async with running_stack(tmp_path, sim_host, fakenvml_path, upstream=url) as stack:
        yield stack, upstream
    upstream.close()


@pytest.fixture
def writes(monkeypatch) -> list[tuple[asyncio.Transport, bytes]]:
    """Every write to a socket transport in this process, in order."""
    seen: list[tuple[asyncio.Transport, bytes]] = []
    transport_class = asyncio.selector_events._SelectorSocketTransport  # type: ignore[attr-defined]
    original = transport_class.write

    def write(self, data):  # type: ignore[no-untyped-def]
        seen.append((self, bytes(data)))
        return original(self, data)

    monkeypatch.setattr(transport_class, "write", write)
    return seen


UP_HOST = b"Host: 127.0.0.1:"
"""The gate's requests to the runtime name the runtime's address; the test's, the gate's."""


def gate_answers(
    writes: list[tuple[asyncio.Transport, bytes]],
) -> list[tuple[asyncio.Transport, bytes]]:
    """The writes that began the gate's answers (the runtime's own keep their hops)."""
    return [
        (t, data) for t, data in writes if data.startswith(b"HTTP/1.1 200") and b"X-Hop" not in data
    ]


def get(path: str, version: bytes = b"1.1") -> bytes:
    return b"GET %b HTTP/%b\r\nHost: localhost:11434\r\n\r\n" % (path.encode(), version)


async def test_a_stream_goes_down_with_the_runtimes_head_and_first_chunk_in_one_write(
    runtime, writes
):
    stack, _ = runtime
    reader, writer = await connect(stack.gate_url)
    for _ in range(2):  # the second on a kept-alive connection to either side
        writer.write(get("/api/tags"))
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), READ_TIMEOUT)
        assert head == GATE_HEAD
        body = await asyncio.wait_for(
            reader.readexactly(len(chunk(FIRST) + chunk(REST)) + 5), READ_TIMEOUT
        )
        assert body == chunk(FIRST) + chunk(REST) + b"0\r\n\r\n"
    writer.close()
    assert [data for _, data in gate_answers(writes)] == [GATE_HEAD + chunk(FIRST)] * 2


async def test_a_head_the_runtime_sent_alone_goes_down_at_once(runtime):
    stack, upstream = runtime
    reader, writer = await connect(stack.gate_url)
    writer.write(get("/api/tags?alone"))
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), READ_TIMEOUT)
    assert head == GATE_HEAD, "the head came before any of the body"
    upstream.go.set()
    reply_body = await asyncio.wait_for(reader.readuntil(b"0\r\n\r\n"), READ_TIMEOUT)
    assert reply_body == chunk(FIRST) + chunk(REST) + b"0\r\n\r\n"
    writer.close()


async def test_a_long_answer_keeps_the_runtimes_length_and_goes_unchunked(runtime):
    stack, _ = runtime
    reader, writer = await connect(stack.gate_url)
    writer.write(get("/api/tags?long"))
    reply = await read_reply(reader)
    assert (reply.status, reply.headers["content-length"]) == (200, str(LONG))
    assert "transfer-encoding" not in reply.headers
    assert reply.body == b"x" * LONG
    writer.write(get("/api/tags"))
    assert (await read_reply(reader)).body == FIRST + REST, "the connection stays usable"
    writer.close()


async def test_an_http10_client_gets_the_stream_unframed_until_the_connection_closes(runtime):
    stack, _ = runtime
    reader, writer = await connect(stack.gate_url)
    writer.write(get("/api/tags", b"1.0"))
    received = await closed_by_peer(reader)
    head, _, body = received.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.0 200 OK") or head.startswith(b"HTTP/1.1 200 OK")
    assert b"transfer-encoding" not in head.lower()
    assert body == FIRST + REST
    writer.close()


async def test_both_sides_of_the_gate_send_without_delay(runtime, writes):
    stack, _ = runtime
    reader, writer = await connect(stack.gate_url)
    writer.write(get("/api/tags"))
    await read_reply(reader)
    writer.close()
    sides = {
        "down": [t for t, _ in gate_answers(writes)],
        "up": [t for t, data in writes if data.startswith(b"GET /api/tags ") and UP_HOST in data],
    }
    for side, transports in sides.items():
        assert transports, side
        for transport in transports:
            sock = transport.get_extra_info("socket")
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY), side
