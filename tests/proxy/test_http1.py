"""The forwarding client against upstreams scripted byte by byte."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest

from gpugate.config.model import UpstreamTimeouts
from gpugate.proxy.http1 import HIGH_WATER
from gpugate.proxy.http1_response import (
    Stall,
    UpstreamClosed,
    UpstreamInvalid,
    UpstreamTimeout,
)
from gpugate.proxy.pool import UpstreamPool

BOUNDS = UpstreamTimeouts(connect=2.0, first_byte=2.0, idle=2.0)
GET = b"GET /x HTTP/1.1\r\nHost: up\r\n\r\n"
OK = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Type: text/plain\r\n\r\nhello"

Serve = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


class Upstream:
    """A TCP server running one coroutine per connection; counts connections."""

    def __init__(self, serve: Serve) -> None:
        self.serve = serve
        self.connections = 0
        self.gone = asyncio.Event()
        self.server: asyncio.Server | None = None

    async def _on_connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self.connections += 1
        try:
            await self.serve(reader, writer)
        finally:
            writer.close()

    async def __aenter__(self) -> UpstreamPool:
        self.server = await asyncio.start_server(self._on_connection, "127.0.0.1", 0)
        port = self.server.sockets[0].getsockname()[1]
        return UpstreamPool("127.0.0.1", port)

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.close()


async def read_request(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            return head + await reader.readexactly(int(line.split(b":")[1]))
    return head


async def answer_each(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    while True:
        try:
            await read_request(reader)
        except asyncio.IncompleteReadError:
            return
        writer.write(OK)
        await writer.drain()


async def test_a_kept_alive_connection_serves_the_next_request():
    upstream = Upstream(answer_each)
    async with upstream as pool:
        for _ in range(3):
            response = await pool.send(GET, None, BOUNDS)
            assert (response.status, response.reason) == (200, "OK")
            assert response.headers()["Content-Type"] == "text/plain"
            assert await response.read(1 << 20, 1.0) == b"hello"
            response.release()
        assert (upstream.connections, pool.opened, pool.idle) == (1, 1, 1)
        pool.close()


async def test_a_chunked_stream_arrives_as_sent_and_the_connection_is_kept():
    parts = [b'{"n":1}\n', b'{"n":2}\n', b'{"n":3}\n']
    sent = asyncio.Event()
    go = [asyncio.Event() for _ in parts]

    async def serve(reader, writer):
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        for part, event in zip(parts, go, strict=True):
            await event.wait()
            writer.write(b"%x\r\n%b\r\n" % (len(part), part))
            await writer.drain()
        writer.write(b"0\r\n\r\n")
        sent.set()
        await answer_each(reader, writer)

    async with Upstream(serve) as pool:
        response = await pool.send(GET, None, BOUNDS)
        assert response.content_length is None
        received = []
        for event in go:
            event.set()
            received.append(await response.chunk(1.0))
        assert received == parts
        assert await response.chunk(1.0) == b""
        assert response.complete
        response.release()
        assert pool.idle == 1
        pool.close()


async def test_an_answer_framed_by_the_connections_end_is_complete_at_the_end():
    async def serve(reader, writer):
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nall of it")
        await writer.drain()

    async with Upstream(serve) as pool:
        response = await pool.send(GET, None, BOUNDS)
        assert await response.read(1 << 20, 1.0) == b"all of it"
        response.release()
        assert pool.idle == 0
        pool.close()


async def test_a_head_answer_has_no_body_and_its_connection_is_not_reused():
    async def serve(reader, writer):
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 1234\r\n\r\n")
        await writer.drain()
        await reader.read()

    upstream = Upstream(serve)
    async with upstream as pool:
        response = await pool.send(b"HEAD /x HTTP/1.1\r\nHost: up\r\n\r\n", None, BOUNDS,
                                   head_only=True)  # fmt: skip
        assert response.content_length == 1234
        assert await response.chunk(1.0) == b""
        response.release()
        assert pool.idle == 0
        pool.close()


async def test_an_idempotent_request_on_a_connection_the_upstream_closed_is_sent_again():
    served = 0

    async def serve(reader, writer):
        nonlocal served
        await read_request(reader)
        served += 1
        writer.write(OK)
        await writer.drain()
        # Closes a kept-alive connection as soon as it is idle: the next request finds
        # it gone (or sends into it as it goes).

    upstream = Upstream(serve)
    async with upstream as pool:
        first = await pool.send(GET, None, BOUNDS, idempotent=True)
        assert await first.read(100, 1.0) == b"hello"
        first.release()
        second = await pool.send(GET, b"", BOUNDS, idempotent=True)
        assert await second.read(100, 1.0) == b"hello"
        second.release()
        assert served == 2
        assert upstream.connections == 2
        pool.close()


async def test_a_post_the_upstream_may_have_acted_on_is_never_sent_twice():
    served = 0

    async def serve(reader, writer):
        nonlocal served
        await read_request(reader)
        served += 1
        if served == 1:
            writer.write(OK)
            await writer.drain()
            await read_request(reader)  # the POST arrives, and the upstream dies
            served += 1

    upstream = Upstream(serve)
    async with upstream as pool:
        first = await pool.send(GET, None, BOUNDS)
        assert await first.read(100, 1.0) == b"hello"
        first.release()
        post = b"POST /x HTTP/1.1\r\nHost: up\r\nContent-Length: 2\r\n\r\n"
        with pytest.raises(UpstreamClosed):
            await pool.send(post, b"{}", BOUNDS)
        assert (served, upstream.connections) == (2, 1)
        assert pool.in_flight == 0


async def test_no_headers_in_time_is_a_first_byte_timeout_and_the_upstream_sees_it_go():
    closed = asyncio.Event()

    async def serve(reader, writer):
        await read_request(reader)
        await reader.read()  # until the client closes
        closed.set()

    async with Upstream(serve) as pool:
        bounds = UpstreamTimeouts(connect=2.0, first_byte=0.1, idle=2.0)
        with pytest.raises(UpstreamTimeout) as raised:
            await pool.send(GET, None, bounds)
        assert raised.value.stall is Stall.FIRST_BYTE
        await asyncio.wait_for(closed.wait(), 2.0)
        assert pool.idle == 0


async def test_silence_mid_body_is_an_idle_timeout():
    async def serve(reader, writer):
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n")
        await writer.drain()
        await reader.read()

    async with Upstream(serve) as pool:
        response = await pool.send(GET, None, BOUNDS)
        assert await response.chunk(1.0) == b"abc"
        with pytest.raises(UpstreamTimeout) as raised:
            await response.chunk(0.1)
        assert raised.value.stall is Stall.IDLE
        response.close()
        assert pool.idle == 0


async def test_an_upstream_that_dies_mid_body_is_a_closed_connection():
    async def serve(reader, writer):
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nonly this")
        await writer.drain()

    async with Upstream(serve) as pool:
        response = await pool.send(GET, None, BOUNDS)
        with pytest.raises(UpstreamClosed):
            await response.read(1000, 1.0)
        response.close()


async def test_an_answer_that_is_not_http_is_invalid():
    async def serve(reader, writer):
        await read_request(reader)
        writer.write(b"SSH-2.0-OpenSSH_9.2\r\n\r\n")
        await writer.drain()
        await reader.read()

    async with Upstream(serve) as pool:
        with pytest.raises(UpstreamInvalid):
            await pool.send(GET, None, BOUNDS)
        assert pool.idle == 0


async def test_a_refused_connection_is_an_os_error():
    server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    server.close()
    await server.wait_closed()
    with pytest.raises(OSError):
        await UpstreamPool("127.0.0.1", port).send(GET, None, BOUNDS)


async def test_an_informational_answer_is_skipped():
    async def serve(reader, writer):
        await read_request(reader)
        writer.write(b"HTTP/1.1 103 Early Hints\r\nLink: </a.css>\r\n\r\n" + OK)
        await writer.drain()
        await answer_each(reader, writer)

    async with Upstream(serve) as pool:
        response = await pool.send(GET, None, BOUNDS)
        assert response.status == 200
        assert response.header(b"link") is None
        assert await response.read(100, 1.0) == b"hello"
        response.release()
        assert pool.idle == 1
        pool.close()


async def test_a_body_streamed_up_chunked_arrives_whole():
    received = asyncio.get_running_loop().create_future()

    async def serve(reader, writer):
        await reader.readuntil(b"\r\n\r\n")
        body = b""
        while True:
            size = int((await reader.readuntil(b"\r\n")).strip(), 16)
            chunk = await reader.readexactly(size + 2)
            if size == 0:
                break
            body += chunk[:-2]
        received.set_result(body)
        writer.write(OK)
        await writer.drain()
        await reader.read()

    async def parts():
        for part in (b"one,", b"", b"two,", b"three"):
            yield part

    head = b"POST /x HTTP/1.1\r\nHost: up\r\nTransfer-Encoding: chunked\r\n\r\n"
    async with Upstream(serve) as pool:
        response = await pool.send(head, parts(), BOUNDS, chunked=True)
        assert response.status == 200
        assert received.result() == b"one,two,three"
        response.close()


async def test_a_slow_reader_pauses_the_upstream_instead_of_buffering_it_all():
    size = 16 * HIGH_WATER
    done = asyncio.Event()

    async def serve(reader, writer):
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % size)
        block = b"x" * 65536
        for _ in range(size // len(block)):
            writer.write(block)
            await writer.drain()
        done.set()
        await answer_each(reader, writer)

    async with Upstream(serve) as pool:
        response = await pool.send(GET, None, BOUNDS)
        first = await response.chunk(1.0)
        # While nobody reads, the upstream cannot finish: reading from it paused.
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(asyncio.shield(done.wait()), 0.3)
        assert response.buffered <= HIGH_WATER + 65536 * 4
        total = len(first) + len(await response.read(size, 2.0))
        assert total == size
        assert done.is_set()
        response.release()
        assert pool.idle == 1
        pool.close()


async def test_past_its_limit_a_request_waits_for_a_slot_and_takes_the_freed_connection():
    upstream = Upstream(answer_each)
    async with upstream as pool:
        pool.limit = 1
        first = await pool.send(GET, None, BOUNDS)
        second = asyncio.ensure_future(pool.send(GET, None, BOUNDS))
        await asyncio.sleep(0)
        assert not second.done() and pool.in_flight == 1
        assert await first.read(100, 1.0) == b"hello"
        first.release()
        response = await asyncio.wait_for(second, 2.0)
        assert await response.read(100, 1.0) == b"hello"
        response.release()
        assert (pool.in_flight, pool.opened, upstream.connections) == (0, 1, 1)
        pool.close()


async def test_a_request_that_finds_no_slot_in_time_times_out_and_takes_none():
    async with Upstream(answer_each) as pool:
        pool.limit = 1
        first = await pool.send(GET, None, BOUNDS)
        bounds = UpstreamTimeouts(connect=0.1, first_byte=2.0, idle=2.0)
        with pytest.raises(UpstreamTimeout) as raised:
            await pool.send(GET, None, bounds)
        assert raised.value.stall is Stall.SLOT
        assert pool.in_flight == 1
        first.close()
        assert pool.in_flight == 0
        # A cancelled wait leaves nothing behind either.
        held = await pool.send(GET, None, BOUNDS)
        waiting = asyncio.ensure_future(pool.send(GET, None, BOUNDS))
        await asyncio.sleep(0)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        held.release()
        assert pool.in_flight == 0
        pool.close()


async def test_a_body_that_breaks_after_the_upstream_closed_leaves_nothing_waiting():
    """The exchange ends with the client's error, and no wait for the answer's head is left
    behind holding the upstream's (an error nobody would retrieve)."""
    closed = asyncio.Event()
    exchanges = []

    async def serve(reader, writer):
        await reader.readuntil(b"\r\n\r\n")
        writer.close()  # gone before the request's body is all sent
        closed.set()

    async def parts():
        exchanges.extend(pool._busy)
        yield b"one,"
        await closed.wait()
        # The gate's side sees the close (its connection lost) before the client's body breaks.
        while not all(c.lost for c in exchanges):
            await asyncio.sleep(0)
        raise ConnectionResetError("the client went")

    head = b"POST /x HTTP/1.1\r\nHost: up\r\nTransfer-Encoding: chunked\r\n\r\n"
    async with Upstream(serve) as pool:
        with pytest.raises(ConnectionResetError):
            await asyncio.wait_for(pool.send(head, parts(), BOUNDS, chunked=True), 5)
        assert pool.idle == 0
    (connection,) = exchanges
    assert connection._headers_waiter is None


class Client:
    """The client's side of an exchange (`ClientEnd`), as request.py's `Request` is."""

    def __init__(self, ended: bool = False) -> None:
        self.ended = ended
        self._on_end: Callable[[], None] | None = None
        self.told = asyncio.Event()
        """The exchange said how to pass the end on."""

    @property
    def on_end(self) -> Callable[[], None] | None:
        return self._on_end

    @on_end.setter
    def on_end(self, callback: Callable[[], None] | None) -> None:
        self._on_end = callback
        self.told.set()

    def end(self) -> None:
        self.ended = True
        if self.on_end is not None:
            self.on_end()


async def test_a_client_that_ended_before_the_answer_has_it_passed_on_and_the_answer_comes():
    saw_end = asyncio.Event()

    async def answer_after_the_end(reader, writer):
        await read_request(reader)
        assert await reader.read() == b""  # the gate's half-close, after the whole request
        saw_end.set()
        writer.write(OK)
        await writer.drain()

    upstream = Upstream(answer_after_the_end)
    async with upstream as pool:
        client = Client(ended=True)
        response = await pool.send(GET, None, BOUNDS, client=client)
        assert saw_end.is_set() and response.status == 200
        assert await response.read(1 << 20, 1.0) == b"hello"
        response.release()
        assert pool.idle == 0, "a connection whose side was ended is never reused"


async def test_a_client_that_ends_while_the_answer_is_awaited_has_it_passed_on_once():
    async def answer_at_the_end(reader, writer):
        await read_request(reader)
        assert await reader.read() == b""
        writer.write(OK)
        await writer.drain()

    upstream = Upstream(answer_at_the_end)
    async with upstream as pool:
        client = Client()
        sending = asyncio.ensure_future(pool.send(GET, None, BOUNDS, client=client))
        await client.told.wait()
        client.end()
        response = await sending
        assert await response.read(1 << 20, 1.0) == b"hello"
        response.release()
        assert pool.idle == 0


async def test_a_client_end_after_its_exchange_never_touches_the_next_one():
    upstream = Upstream(answer_each)
    async with upstream as pool:
        first = Client()
        response = await pool.send(GET, None, BOUNDS, client=first)
        assert await response.read(1 << 20, 1.0) == b"hello"
        response.release()
        second = await pool.send(GET, None, BOUNDS)
        first.end()  # late: the connection carries another exchange now
        assert await second.read(1 << 20, 1.0) == b"hello"
        second.release()
        third = await pool.send(GET, None, BOUNDS)
        assert third.status == 200 and await third.read(1 << 20, 1.0) == b"hello"
        third.release()
        assert (upstream.connections, pool.idle) == (1, 1)
