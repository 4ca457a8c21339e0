"""Framing is the gate's: what the upstream reads as one request is what the gate read as one.

Behind the gate sits a recording upstream that parses what arrives with its own HTTP
parser (llhttp, as Node's), so a body the gate sent unframed would show up there as a second
request the gate never admitted.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging

import attrs
import httptools
import pytest

from tests.gate.harness import running_stack
from tests.listeners.wire import connect, read_reply

ANSWER = b'{"models":[]}'


@attrs.define
class Seen:
    method: str = ""
    path: str = ""
    headers: list[tuple[bytes, bytes]] = attrs.Factory(list)
    body: bytes = b""
    connection: int = 0


class Recorder:
    """An upstream that records every request its parser finds, and answers each 200."""

    def __init__(self, *, early: bool = False) -> None:
        self.seen: list[Seen] = []
        self.connections = 0
        self.early = early
        """Answer 404 as soon as a request's headers are read, then close (an early answer)."""
        self.server: asyncio.Server | None = None

    @property
    def requests(self) -> list[Seen]:
        """What clients sent through the gate (the gate's own listings carry no
        X-Forwarded-For)."""
        return [s for s in self.seen if any(n == b"x-forwarded-for" for n, _ in s.headers)]

    async def start(self) -> str:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    def close(self) -> None:
        if self.server is not None:
            self.server.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        done: asyncio.Queue[Seen] = asyncio.Queue()
        recorder = self

        number = self.connections

        class Protocol:
            current = Seen(connection=number)

            def on_url(self, url: bytes) -> None:
                self.current.path += url.decode("latin-1")

            def on_header(self, name: bytes, value: bytes) -> None:
                self.current.headers.append((name.lower(), value))

            def on_headers_complete(self) -> None:
                self.current.method = parser.get_method().decode()
                if recorder.early:
                    recorder.seen.append(self.current)
                    done.put_nowait(self.current)

            def on_body(self, body: bytes) -> None:
                self.current.body += body

            def on_message_complete(self) -> None:
                if not recorder.early:
                    recorder.seen.append(self.current)
                    done.put_nowait(self.current)
                self.current = Seen(connection=number)

        parser = httptools.HttpRequestParser(Protocol())
        with contextlib.suppress(ConnectionError, httptools.HttpParserError):
            while data := await reader.read(65536):
                parser.feed_data(data)
                while not done.empty():
                    done.get_nowait()
                    if self.early:
                        # As Go's server ends such an exchange: the answer, the write side
                        # shut, the rest of the upload read and dropped for a while.
                        writer.write(
                            b"HTTP/1.1 404 Not Found\r\nConnection: close\r\n"
                            b"Content-Length: 0\r\n\r\n"
                        )
                        writer.write_eof()
                        with contextlib.suppress(TimeoutError):
                            async with asyncio.timeout(2.0):
                                while await reader.read(65536):
                                    pass
                        writer.close()
                        return
                    writer.write(
                        b"HTTP/1.1 200 OK\r\nContent-Type: application/json; charset=utf-8\r\n"
                        b"Content-Length: %d\r\n\r\n%b" % (len(ANSWER), ANSWER)
                    )
                    await writer.drain()
        writer.close()


@pytest.fixture
async def recorded(tmp_path, sim_host, fakenvml_path):
    recorder = Recorder()
    upstream = await recorder.start()
    async with running_stack(tmp_path, sim_host, fakenvml_path, upstream=upstream) as stack:
        yield stack, recorder
    recorder.close()


def smuggled_generate() -> bytes:
    body = json.dumps({"model": "llama3.2:3b", "prompt": "hi", "keep_alive": -1}).encode()
    return (
        b"POST /api/generate HTTP/1.1\r\nHost: localhost:11434\r\n"
        b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%b" % (len(body), body)
    )


@pytest.mark.parametrize("nominated", ["Content-Length", "content-length, keep-alive"])
async def test_a_connection_header_naming_content_length_smuggles_nothing(recorded, nominated):
    stack, recorder = recorded
    inner = smuggled_generate()
    raw = (
        b"GET /api/tags HTTP/1.1\r\nHost: localhost:11434\r\nConnection: %b\r\n"
        b"Content-Length: %d\r\n\r\n%b" % (nominated.encode(), len(inner), inner)
    )
    reader, writer = await connect(stack.gate_url)
    writer.write(raw)
    reply = await read_reply(reader)
    # A second request on the same upstream connection must get its own answer.
    writer.write(b"GET /api/version HTTP/1.1\r\nHost: localhost:11434\r\n\r\n")
    second = await read_reply(reader)
    writer.close()
    assert (reply.status, reply.body, second.status) == (200, ANSWER, 200)
    # The upstream read one GET with the whole inner request as its body, never a POST.
    assert [(r.method, r.path) for r in recorder.requests] == [
        ("GET", "/api/tags"),
        ("GET", "/api/version"),
    ]
    assert recorder.requests[0].body == inner
    assert (b"content-length", str(len(inner)).encode()) in recorder.requests[0].headers
    assert stack.gate.core.leases() == []


async def test_a_connection_header_naming_transfer_encoding_keeps_the_chunks_framed(recorded):
    stack, recorder = recorded
    inner = smuggled_generate()
    raw = (
        b"POST /api/show HTTP/1.1\r\nHost: localhost:11434\r\n"
        b"Connection: Transfer-Encoding\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"%x\r\n%b\r\n0\r\n\r\n" % (len(inner), inner)
    )
    reader, writer = await connect(stack.gate_url)
    writer.write(raw)
    reply = await read_reply(reader)
    writer.close()
    assert reply.status == 200
    assert [(r.method, r.path, r.body) for r in recorder.requests] == [("POST", "/api/show", inner)]


@pytest.mark.parametrize(
    "codings",
    [[b"gzip, chunked"], [b"chunked, gzip"], [b"identity"], [b"chunked", b"chunked"]],
)
async def test_a_transfer_coding_the_gate_does_not_frame_is_refused_as_go_refuses_it(
    recorded, codings
):
    stack, recorder = recorded
    head = b"POST /api/generate HTTP/1.1\r\nHost: localhost:11434\r\n"
    head += b"".join(b"Transfer-Encoding: %b\r\n" % c for c in codings)
    reader, writer = await connect(stack.gate_url)
    body = b'{"model":"llama3.2:3b","prompt":"hi"}'
    writer.write(head + b"\r\n%x\r\n%b\r\n0\r\n\r\n" % (len(body), body))
    data = await asyncio.wait_for(reader.read(), 10)
    writer.close()
    status = int(data.split(b" ", 2)[1])
    # Go answers 501 "Unsupported transfer encoding"; aiohttp's parser refuses some first (400).
    assert status in (400, 501), data
    if status == 501:
        assert data.endswith(b"Unsupported transfer encoding")
    assert recorder.requests == []
    assert stack.gate.core.leases() == []


async def test_an_upload_the_runtime_answers_early_gets_that_answer_and_a_new_connection(
    tmp_path, sim_host, fakenvml_path, caplog
):
    caplog.set_level(logging.INFO)
    recorder = Recorder(early=True)
    upstream = await recorder.start()
    async with running_stack(tmp_path, sim_host, fakenvml_path, upstream=upstream) as stack:
        reader, writer = await connect(stack.gate_url)
        writer.write(
            b"POST /api/blobs/sha256:00 HTTP/1.1\r\nHost: localhost:11434\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n"
        )
        chunk = b"x" * 65536

        async def upload() -> None:
            with contextlib.suppress(ConnectionError):
                for _ in range(320):  # 20 MiB
                    writer.write(b"%x\r\n%b\r\n" % (len(chunk), chunk))
                    await writer.drain()
                writer.write(b"0\r\n\r\n")
                await writer.drain()

        sending = asyncio.create_task(upload())
        reply = await read_reply(reader)
        sending.cancel()
        writer.close()
        assert reply.status == 404
        # The next request does not reuse the connection whose request ended in doubt.
        reader, writer = await connect(stack.gate_url)
        writer.write(b"GET /api/tags HTTP/1.1\r\nHost: localhost:11434\r\n\r\n")
        again = await read_reply(reader)
        writer.close()
    recorder.close()
    assert again.status == 404
    first, second = recorder.requests
    assert first.connection != second.connection
    assert [r for r in caplog.records if r.exc_info] == []
    assert stack.gate.core.leases() == []


async def test_a_websocket_handshake_with_a_body_is_an_ordinary_request_as_go_serves_it(recorded):
    # Go's net/http hands a GET with Upgrade and a body to its handler like any other
    # request (Ollama routes it: no websocket route): the gate relays it as a plain request,
    # the hop-by-hop Upgrade dropped, never as a websocket.
    stack, recorder = recorded
    reader, writer = await connect(stack.gate_url)
    writer.write(
        b"GET /ws HTTP/1.1\r\nHost: localhost:11434\r\nConnection: Upgrade\r\n"
        b"Upgrade: websocket\r\nSec-WebSocket-Version: 13\r\n"
        b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nContent-Length: 3\r\n\r\nabc"
    )
    reply = await read_reply(reader)
    writer.close()
    assert reply.status == 200
    (seen,) = recorder.requests
    assert (seen.method, seen.path, seen.body) == ("GET", "/ws", b"abc")
    assert b"upgrade" not in [name for name, _ in seen.headers]
    events = [e.failure_class for e in stack.gate.events.recent() if e.failure_class]
    assert "TIMEOUT" not in events


@pytest.mark.parametrize("expect", [b"\xff\xfe", b"x\xe2\x82\xac"])
async def test_an_expect_header_of_any_bytes_is_answered_as_go_answers_it(recorded, expect, caplog):
    stack, recorder = recorded
    reader, writer = await connect(stack.gate_url)
    writer.write(
        b"POST /api/show HTTP/1.1\r\nHost: localhost:11434\r\nExpect: %b\r\n"
        b"Content-Length: 2\r\n\r\n{}" % expect
    )
    reply = await read_reply(reader)
    writer.close()
    assert (reply.status, reply.body, reply.headers.get("connection")) == (417, b"", "close")
    assert recorder.requests == []
    assert [r for r in caplog.records if r.exc_info] == []


async def test_a_connection_header_outside_latin1_is_forwarded(recorded, caplog):
    stack, recorder = recorded
    reader, writer = await connect(stack.gate_url)
    writer.write(
        "GET /api/tags HTTP/1.1\r\nHost: localhost:11434\r\n"
        "Connection: keep-alive, \u20ac, X-Hop\r\nX-Hop: nominated\r\n\r\n".encode()
    )
    reply = await read_reply(reader)
    writer.close()
    assert (reply.status, reply.body) == (200, ANSWER)
    assert [r.path for r in recorder.requests] == ["/api/tags"]
    assert all(name != b"x-hop" for name, _ in recorder.requests[0].headers)
    assert [r for r in caplog.records if r.exc_info] == []
