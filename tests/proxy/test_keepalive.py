"""Connections to a runtime whose server closes them on its own (cpp-httplib: after 5 s idle,
after 100 requests) are reused only well inside both, so no request ever goes out on a
connection the server is closing."""

from __future__ import annotations

import asyncio
import socket

import attrs
import pytest

from gpugate.config.model import UpstreamTimeouts
from gpugate.proxy.http1_response import Response
from gpugate.proxy.pool import UpstreamPool
from gpugate.proxy.relay import runtime_head
from gpugate.runtimes.keepalive import (
    HTTPLIB,
    HTTPLIB_NAGLE,
    KEEP,
    LLAMA_HTTPLIB,
    NEVER,
    KeepAlivePolicy,
)
from gpugate.runtimes.llamaserver.router import RouterReading
from gpugate.runtimes.llamaserver.single import LlamaSingleReading
from gpugate.runtimes.ollama.adapter import OllamaReading
from gpugate.runtimes.whisper.adapter import WhisperReading
from tests.proxy.test_http1 import read_request

BOUNDS = UpstreamTimeouts(connect=2.0, first_byte=2.0, idle=2.0)
POST = b"POST /inference HTTP/1.1\r\nHost: up\r\nContent-Length: 2\r\n\r\n"


class Httplib:
    """A server that keeps a connection as cpp-httplib does: it waits `timeout` seconds
    for the next request, then closes; its `max_requests`th answer says
    `Connection: close` and ends the connection."""

    def __init__(self, timeout: float, max_requests: int) -> None:
        self.timeout = timeout
        self.max_requests = max_requests
        self.connections = 0
        self.served: list[int] = []
        """Requests answered, per connection."""
        self.timed_out = 0
        """Connections the server closed on its idle timer."""
        self.left = 0
        """Connections the client closed."""
        self.ended = 0
        """Connections over, whoever closed them."""
        self._change = asyncio.Event()
        self.server: asyncio.Server | None = None

    async def until_ended(self, count: int, timeout: float = 5.0) -> None:
        """Return once `count` connections are over on the server's side."""
        async with asyncio.timeout(timeout):
            while self.ended < count:
                self._change.clear()
                await self._change.wait()

    async def start(self, policy: KeepAlivePolicy) -> UpstreamPool:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port = self.server.sockets[0].getsockname()[1]
        return UpstreamPool("127.0.0.1", port, keep_alive=policy)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        index = len(self.served)
        self.served.append(0)
        try:
            for count in range(self.max_requests, 0, -1):
                try:
                    await asyncio.wait_for(read_request(reader), self.timeout)
                except TimeoutError:
                    self.timed_out += 1
                    return
                except asyncio.IncompleteReadError:
                    self.left += 1
                    return
                self.served[index] += 1
                close = b"Connection: close" if count == 1 else b"Keep-Alive: timeout=5, max=100"
                writer.write(b"HTTP/1.1 200 OK\r\n%b\r\nContent-Length: 2\r\n\r\nok" % close)
                await writer.drain()
        finally:
            writer.close()
            self.ended += 1
            self._change.set()

    def close(self) -> None:
        assert self.server is not None
        self.server.close()


async def exchange(pool: UpstreamPool, head: bytes = POST, body: bytes = b"{}") -> bytes:
    response = await pool.send(head, body, BOUNDS)
    data = await response.read(100, 1.0)
    response.release()
    return data


async def test_within_its_window_a_connection_carries_the_next_request():
    server = Httplib(timeout=1.0, max_requests=100)
    pool = await server.start(KeepAlivePolicy(idle_timeout=1.0))
    for _ in range(3):
        assert await exchange(pool) == b"ok"
        await asyncio.sleep(0.05)
    assert (server.connections, server.served, pool.idle) == (1, [3], 1)
    pool.close()
    server.close()


async def test_an_idle_connection_past_its_window_is_closed_before_the_server_times_out():
    server = Httplib(timeout=0.5, max_requests=100)
    pool = await server.start(KeepAlivePolicy(idle_timeout=0.5))  # reused for 0.2 s
    assert await exchange(pool) == b"ok"
    await server.until_ended(1)  # the sweep, 0.2 s after the answer, closed it
    assert pool.idle == 0, "the sweep closed it"
    assert (server.left, server.timed_out) == (1, 0)
    assert await exchange(pool) == b"ok"
    assert (server.connections, pool.opened) == (2, 2)
    pool.close()
    server.close()


async def test_a_connection_past_its_window_is_never_taken_even_before_the_sweep():
    server = Httplib(timeout=5.0, max_requests=100)
    pool = await server.start(KeepAlivePolicy(idle_timeout=5.0))
    assert await exchange(pool) == b"ok"
    assert await exchange(pool) == b"ok"
    (idle,) = pool._idle
    idle.idle_since -= 2.5  # as if it had waited 2.5 s: past the 2 s window
    assert await exchange(pool) == b"ok"
    await server.until_ended(1)
    assert server.served == [2, 1]
    assert server.left == 1 and idle.lost
    pool.close()
    server.close()


async def test_no_connection_carries_more_requests_than_the_policy_allows():
    # The server would take five on one connection; the runtime's policy says three.
    server = Httplib(timeout=5.0, max_requests=5)
    pool = await server.start(KeepAlivePolicy(idle_timeout=5.0, max_requests=3))
    for _ in range(7):
        assert await exchange(pool) == b"ok"
    await server.until_ended(2)
    assert server.served == [3, 3, 1]
    pool.close()
    server.close()


async def test_the_servers_last_answer_on_a_connection_ends_it():
    server = Httplib(timeout=5.0, max_requests=2)
    pool = await server.start(KEEP)
    for _ in range(5):
        assert await exchange(pool) == b"ok"
    assert server.served == [2, 2, 1]
    pool.close()
    server.close()


async def test_only_max_idle_connections_are_kept_idle():
    server = Httplib(timeout=5.0, max_requests=100)
    pool = await server.start(KeepAlivePolicy(idle_timeout=5.0, max_idle=1))
    first = await pool.send(POST, b"{}", BOUNDS)
    second = await pool.send(POST, b"{}", BOUNDS)
    for response in (first, second):
        assert await response.read(100, 1.0) == b"ok"
        response.release()
    await server.until_ended(1)
    assert (server.connections, pool.idle, server.left) == (2, 1, 1)
    pool.close()
    server.close()


async def test_posts_at_every_pause_around_the_servers_timeout_all_arrive_once():
    # The gate's window is 40 % of the server's timeout: a pause near the timeout, where a
    # kept connection could be closing as the POST goes out, is always a new connection.
    server = Httplib(timeout=0.3, max_requests=100)
    pool = await server.start(KeepAlivePolicy(idle_timeout=0.3))
    pauses = [0.0, 0.05, 0.1, 0.13, 0.2, 0.27, 0.29, 0.3, 0.31, 0.33, 0.05]
    for pause in pauses:
        await asyncio.sleep(pause)
        assert await exchange(pool) == b"ok"
    # Every connection over, the last one too: by the gate's sweep or the server's timer.
    await server.until_ended(server.connections)
    assert sum(server.served) == len(pauses)
    assert server.timed_out == 0, "the gate closed every connection before the server's timer"
    pool.close()
    server.close()


async def test_a_policy_without_reuse_opens_a_connection_per_request():
    server = Httplib(timeout=5.0, max_requests=100)
    pool = await server.start(NEVER)
    head = POST.replace(b"\r\n\r\n", b"\r\nConnection: close\r\n\r\n")
    for _ in range(3):
        assert await exchange(pool, head) == b"ok"
    assert (server.connections, pool.idle) == (3, 0)
    pool.close()
    server.close()


async def test_connections_to_the_runtime_send_without_delay():
    server = Httplib(timeout=5.0, max_requests=100)
    pool = await server.start(KEEP)
    assert await exchange(pool) == b"ok"
    (connection,) = pool._idle
    assert connection.transport is not None
    sock = connection.transport.get_extra_info("socket")
    assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
    pool.close()
    server.close()


def test_cpp_httplib_runtimes_are_reused_well_inside_their_servers_keep_alive():
    # whisper-server reads what it left of a refused body as the next request on a kept
    # connection: every request to it goes on a connection of its own.
    whisper = WhisperReading.keep_alive
    assert not whisper.reuse and not whisper.pools_idle
    # Its server is cpp-httplib with Nagle on; llama.cpp builds its own without.
    assert whisper == attrs.evolve(HTTPLIB_NAGLE, reuse=False) and whisper.nagle
    for reading in (RouterReading, LlamaSingleReading):
        assert reading.keep_alive is LLAMA_HTTPLIB, reading
    assert attrs.evolve(HTTPLIB, ends_streams=True, spare=True) == LLAMA_HTTPLIB
    assert not HTTPLIB.nagle and not whisper.spare
    # The gate's own calls (aiohttp's client keeps a connection 15 s) open one each.
    assert not HTTPLIB.pools_idle
    assert (HTTPLIB.idle_timeout, HTTPLIB.max_requests) == (5.0, 100)
    assert HTTPLIB.reuse_within == pytest.approx(2.0)
    assert OllamaReading.keep_alive is KEEP and KEEP.pools_idle


def quick_ack(pool: UpstreamPool) -> tuple[bool, int]:
    """The idle connection's flag and what its socket says of TCP_QUICKACK (1: ACKs go out
    as data arrives, 0: Linux's interactive mode, where they wait to ride on data)."""
    (connection,) = pool._idle
    assert connection.transport is not None
    sock = connection.transport.get_extra_info("socket")
    return connection.quick_ack, sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_QUICKACK)


async def test_a_reused_connection_to_a_server_with_nagle_on_acks_each_answer_at_once():
    # Sending a request enters the interactive mode that holds ACKs back; a server that
    # writes its head and body apart with Nagle on would then wait for the delayed ACK.
    server = Httplib(timeout=5.0, max_requests=100)
    pool = await server.start(HTTPLIB_NAGLE)
    for _ in range(3):
        assert await exchange(pool) == b"ok"
        assert quick_ack(pool) == (True, 1)
    assert (server.connections, pool.opened) == (1, 1)
    pool.close()
    server.close()


async def test_a_reused_connection_to_a_server_without_nagle_sets_nothing():
    server = Httplib(timeout=5.0, max_requests=100)
    pool = await server.start(HTTPLIB)
    for _ in range(2):
        assert await exchange(pool) == b"ok"
    assert quick_ack(pool)[0] is False and pool.opened == 1
    pool.close()
    server.close()


def answer(*headers: tuple[bytes, bytes], announce: bytes | None = None) -> Response:
    response = Response(None)  # type: ignore[arg-type]
    response.status, response.reason = 200, "OK"
    response.raw_headers = list(headers)
    response.announce = announce
    return response


def test_a_kept_client_sees_the_runtimes_keep_alive():
    kept = answer((b"Keep-Alive", b"timeout=5, max=100"), (b"Content-Length", b"2"))
    assert runtime_head(kept, ()) == (
        b"HTTP/1.1 200 OK\r\nKeep-Alive: timeout=5, max=100\r\nContent-Length: 2\r\n\r\n"
    )


def test_where_the_gate_asked_for_close_the_runtimes_keep_alive_is_put_back():
    # whisper-server answers the gate's `Connection: close` in kind; a client the gate
    # keeps is told what whisper-server would tell it, where it would.
    closed = answer(
        (b"Connection", b"close"), (b"Content-Length", b"2"),
        announce=HTTPLIB.announcement,
    )  # fmt: skip
    assert runtime_head(closed, ()) == (
        b"HTTP/1.1 200 OK\r\nKeep-Alive: timeout=5, max=100\r\nContent-Length: 2\r\n\r\n"
    )
    # Without an announcement (a server that sends none) nothing is made up.
    plain = answer((b"Connection", b"close"), (b"Content-Length", b"2"))
    assert runtime_head(plain, ()) == b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n"


def test_only_a_pool_that_never_reuses_puts_the_announcement_back():
    assert HTTPLIB.announcement == b"timeout=5, max=100"
    assert KEEP.announcement is None and NEVER.announcement is None
    assert UpstreamPool("127.0.0.1", 1, keep_alive=HTTPLIB).announcement is None
    whisper = UpstreamPool("127.0.0.1", 1, keep_alive=WhisperReading.keep_alive)
    assert whisper.announcement == b"timeout=5, max=100"
    assert not whisper.quick_ack  # a new connection per request: nothing to hold back


async def test_a_server_that_ends_streams_never_gets_a_request_on_a_streamed_connection():
    # llama-server closes the connection after every chunked answer that said keep-alive;
    # its answers of known length keep it open.
    requests: list[list[bytes]] = []
    """The methods each connection carried, in the order they were opened."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        carried: list[bytes] = []
        requests.append(carried)
        while True:
            try:
                head = await read_request(reader)
            except asyncio.IncompleteReadError:
                writer.close()
                return
            carried.append(head.split(b" ", 1)[0])
            if head.startswith(b"POST"):
                writer.write(
                    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n"
                )
            else:
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
            await writer.drain()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    pool = UpstreamPool("127.0.0.1", port, keep_alive=LlamaSingleReading.keep_alive)
    get = b"GET /health HTTP/1.1\r\nHost: up\r\n\r\n"
    for _ in range(3):
        assert await exchange(pool) == b"ok"  # streamed: that connection is closed
        # ... and a spare is opened at once for the next request, likely soon.
        spare = pool._spare
        assert spare is not None
        await spare
        assert pool.idle == 1
    for _ in range(3):
        assert await exchange(pool, get, b"") == b"ok"  # of known length: kept
    assert (pool.opened, pool.idle) == (4, 1)
    assert requests == [[b"POST"], [b"POST"], [b"POST"], [b"GET"] * 3]
    pool.close()
    server.close()
