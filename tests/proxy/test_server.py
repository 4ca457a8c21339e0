"""The listeners' own HTTP/1 server (proxy/server.py, connections.py): requests in order,
bodies as they arrive, refusals byte for byte, keep-alive and close, timers, caps, and
waiting connections giving way to a new one.

Most tests run the server around a small handler of their own, so what is checked is the
server alone; the last ones go through the whole gate to a runtime of their own.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
from collections.abc import AsyncIterator, Awaitable, Callable

import attrs

from gpugate.config.model import ListenerLimits
from gpugate.proxy.connections import REFUSAL, ListenerServer
from gpugate.proxy.dialects import go
from gpugate.proxy.relay import send_answer
from gpugate.proxy.request import Request
from gpugate.proxy.runners import ListenerRunner, quiet_loop_errors
from tests.gate.harness import running_stack
from tests.listeners.wire import READ_TIMEOUT, closed_by_peer, read_reply

LIMITS = ListenerLimits(max_connections_per_client=1000)
"""The listener's cap alone (a per-address cap would make room first: all tests connect
from one address)."""
WAIT = 10.0


@attrs.define
class Served:
    runner: ListenerRunner
    port: int
    seen: list[Request]

    @property
    def server(self) -> ListenerServer:
        return self.runner.server

    async def connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        return await asyncio.open_connection("127.0.0.1", self.port)


async def echo(request: Request) -> None:
    """Answer with the method, path and body read whole."""
    body = await request.body.read(1 << 20)
    text = b"%b %b %b" % (request.method.encode(), request.path.encode(), body)
    send_answer(request, 200, [("Content-Type", "text/plain")], text)


@contextlib.asynccontextmanager
async def serving(
    handler: Callable[[Request], Awaitable[None]] = echo,
    limits: ListenerLimits = LIMITS,
    max_connections: int = 64,
) -> AsyncIterator[Served]:
    seen: list[Request] = []

    async def handle(request: Request) -> None:
        seen.append(request)
        await handler(request)

    async def nothing() -> None:
        return None

    runner = ListenerRunner(handle, go.DIALECT, nothing, limits, "test listener", max_connections)
    await runner.start("127.0.0.1", 0)
    try:
        yield Served(runner, runner.addresses[0][1], seen)
    finally:
        await runner.drain(1.0)
        await runner.cleanup()


async def until(condition: Callable[[], bool]) -> None:
    """Wait for a state of the server no event announces (a connection it accepted)."""
    async with asyncio.timeout(WAIT):
        while not condition():
            await asyncio.sleep(0.01)


def get(path: str, extra: str = "") -> bytes:
    return f"GET {path} HTTP/1.1\r\nHost: x\r\n{extra}\r\n".encode()


async def test_pipelined_requests_are_answered_in_order():
    async with serving() as served:
        reader, writer = await served.connect()
        post = b"POST /c HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\nhi"
        writer.write(get("/a") + get("/b") + post)
        answers = [await read_reply(reader) for _ in range(3)]
        writer.close()
    assert [a.body for a in answers] == [b"GET /a ", b"GET /b ", b"POST /c hi"]
    assert [r.path for r in served.seen] == ["/a", "/b", "/c"]


async def test_junk_after_a_complete_request_is_refused_after_its_answer():
    async with serving() as served:
        reader, writer = await served.connect()
        writer.write(get("/a") + b"junk\r\n\r\n")
        first = await read_reply(reader)
        rest = await closed_by_peer(reader)
        writer.close()
    assert (first.status, first.body) == (200, b"GET /a ")
    assert rest == go.BAD_REQUEST.data  # byte for byte, then the close


async def test_a_refused_head_gets_the_dialects_bytes_and_the_connection_closes():
    async with serving() as served:
        reader, writer = await served.connect()
        writer.write(b"GET /a HTTP/2.0\r\nHost: x\r\n\r\n" + get("/b"))
        rest = await closed_by_peer(reader)
        writer.close()
    assert rest == go.UNSUPPORTED_VERSION.data
    assert served.seen == []  # nothing after the refusal was read as a request


async def test_a_kept_connection_serves_the_next_request_and_close_ends_it():
    async with serving() as served:
        reader, writer = await served.connect()
        writer.write(get("/a"))
        first = await read_reply(reader)
        writer.write(get("/b", "Connection: close\r\n"))
        second = await read_reply(reader)
        assert await closed_by_peer(reader) == b""
        writer.close()
    assert "connection" not in first.headers
    assert second.headers["connection"] == "close"
    assert [r.path for r in served.seen] == ["/a", "/b"]


async def test_a_handler_that_closes_ends_the_connection_after_its_answer():
    async def closing(request: Request) -> None:
        request.close = True  # as an upstream's own `Connection: close` does
        send_answer(request, 500, [], b"oops")

    async with serving(closing) as served:
        reader, writer = await served.connect()
        writer.write(get("/a") + get("/b"))
        answer = await read_reply(reader)
        assert await closed_by_peer(reader) == b""
        writer.close()
    assert (answer.status, answer.headers["connection"]) == (500, "close")
    assert len(served.seen) == 1  # the pipelined second request was not served


async def test_expect_100_continue_is_answered_before_the_body_is_sent():
    async with serving() as served:
        reader, writer = await served.connect()
        writer.write(
            b"POST /up HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\n"
        )
        interim = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), READ_TIMEOUT)
        writer.write(b"hello")
        answer = await read_reply(reader)
        writer.close()
    assert interim == b"HTTP/1.1 100 Continue\r\n\r\n"
    assert answer.body == b"POST /up hello"


async def test_a_request_answered_without_its_body_is_not_invited_to_send_it():
    async def refuse(request: Request) -> None:
        send_answer(request, 403, [], b"")

    async with serving(refuse) as served:
        reader, writer = await served.connect()
        writer.write(
            b"POST /up HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\n"
        )
        answer = await read_reply(reader)
        writer.close()
    assert answer.status == 403  # the first thing written: no `100 Continue` before it


async def test_a_chunked_body_in_pieces_is_read_whole_and_the_next_request_follows():
    async with serving() as served:
        reader, writer = await served.connect()
        writer.write(b"POST /c HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhel")
        await writer.drain()
        writer.write(b"lo\r\n6;ext=1\r\n world\r\n0\r\nX-Trailer: t\r\n\r\n" + get("/next"))
        first = await read_reply(reader)
        second = await read_reply(reader)
        writer.close()
    assert (first.body, second.body) == (b"POST /c hello world", b"GET /next ")


async def test_a_trailer_cut_in_two_writes_is_read_whole_and_the_next_request_follows():
    # Go's chunked reader hands back an unfinished trailer line unused: it is fed again
    # with the bytes that finish it.
    async with serving() as served:
        reader, writer = await served.connect()
        writer.write(
            b"POST /c HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
            b"3\r\nabc\r\n0\r\nX-Trailer: "
        )
        await writer.drain()
        await until(lambda: len(served.seen) == 1)
        writer.write(b"t\r\n\r\n" + get("/next"))
        first = await read_reply(reader)
        second = await read_reply(reader)
        writer.close()
    assert (first.body, second.body) == (b"POST /c abc", b"GET /next ")


async def test_a_malformed_chunk_is_the_handlers_error_and_the_connection_ends():
    # Go's net/http writes nothing itself for a malformed chunked body: its handler's read
    # fails (the echo handler then answers nothing) and the connection ends.
    async with serving() as served:
        reader, writer = await served.connect()
        writer.write(b"POST /c HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n")
        rest = await closed_by_peer(reader)
        writer.close()
    assert rest == b""
    assert [r.path for r in served.seen] == ["/c"]


async def test_a_get_whose_body_is_still_arriving_is_answered_at_once():
    answered = asyncio.Event()

    async def at_once(request: Request) -> None:
        send_answer(request, 200, [], b"now")
        answered.set()

    async with serving(at_once) as served:
        reader, writer = await served.connect()
        writer.write(
            b"GET /q HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n"
        )
        answer = await read_reply(reader)
        # Its body never ended: the connection is not reused (nobody knows where the next
        # request would start); what the client still sends is read and dropped.
        writer.write(b"3\r\ndef\r\n")
        assert await closed_by_peer(reader) == b""
        writer.close()
    assert answer.body == b"now"


async def test_a_head_that_never_completes_is_dropped_after_the_header_timeout():
    limits = attrs.evolve(LIMITS, header_timeout=0.2)
    async with serving(limits=limits) as served:
        reader, writer = await served.connect()
        writer.write(b"GET /slow HTTP/1.1\r\nHost:")
        assert await closed_by_peer(reader) == b""
        writer.close()
        assert served.server.open_connections == 0
    assert served.seen == []


async def test_a_body_that_stops_is_dropped_after_the_body_timeout_and_its_handler_ends():
    ended: asyncio.Future[BaseException] = asyncio.get_running_loop().create_future()

    async def reader_of_body(request: Request) -> None:
        try:
            await request.body.read(1 << 20)
        except BaseException as exc:
            ended.set_result(exc)
            raise

    limits = attrs.evolve(LIMITS, body_timeout=0.2)
    async with serving(reader_of_body, limits=limits) as served:
        reader, writer = await served.connect()
        writer.write(b"POST /b HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\nab")
        assert await closed_by_peer(reader) == b""
        writer.close()
        exc = await asyncio.wait_for(ended, WAIT)
    assert isinstance(exc, ConnectionError | asyncio.CancelledError)


async def test_an_idle_connection_is_closed_after_the_idle_timeout():
    limits = attrs.evolve(LIMITS, idle_timeout=0.2)
    async with serving(limits=limits) as served:
        reader, writer = await served.connect()
        writer.write(get("/a"))
        assert (await read_reply(reader)).status == 200
        assert await closed_by_peer(reader) == b""
        writer.close()


async def test_a_full_listener_refuses_only_when_no_connection_waits():
    release = asyncio.Event()
    both = asyncio.Event()
    started: list[str] = []

    async def blocking(request: Request) -> None:
        started.append(request.path)
        if len(started) == 2:
            both.set()
        await release.wait()
        send_answer(request, 200, [], b"done")

    async with serving(blocking, max_connections=2) as served:
        busy = [await served.connect() for _ in range(2)]
        for i, (_, writer) in enumerate(busy):
            writer.write(get(f"/busy{i}"))
        await asyncio.wait_for(both.wait(), WAIT)
        reader, writer = await served.connect()
        refused = await closed_by_peer(reader)
        writer.close()
        release.set()
        answers = [await read_reply(r) for r, _ in busy]
        for _, w in busy:
            w.close()
    assert refused == REFUSAL
    assert [a.body for a in answers] == [b"done", b"done"]


async def test_waiting_connections_give_way_to_a_new_one_longest_waiting_first():
    async with serving(max_connections=3) as served:
        # One served and kept (waiting between requests), two that sent nothing.
        kept_reader, kept_writer = await served.connect()
        kept_writer.write(get("/kept"))
        assert (await read_reply(kept_reader)).status == 200
        silent = [await served.connect() for _ in range(2)]
        await until(lambda: served.server.open_connections == 3)
        reader, writer = await served.connect()
        writer.write(get("/new"))
        answer = await read_reply(reader)
        # The longest waiting was the kept one: closed without a word.
        assert await closed_by_peer(kept_reader) == b""
        writer.close()
        kept_writer.close()
        for _, w in silent:
            w.close()
        assert served.server.reclaimed == 1
    assert answer.body == b"GET /new "


async def test_a_connection_with_part_of_a_head_gives_way_with_the_refusal():
    async with serving(max_connections=1) as served:
        slow_reader, slow_writer = await served.connect()
        slow_writer.write(b"GET /slow HTTP/1.1\r\n")
        await slow_writer.drain()
        await until(lambda: served.server.open_connections == 1)
        reader, writer = await served.connect()
        writer.write(get("/new"))
        answer = await read_reply(reader)
        given = await closed_by_peer(slow_reader)
        writer.close()
        slow_writer.close()
    assert answer.body == b"GET /new "
    assert given == REFUSAL


# -- through the gate ----------------------------------------------------------------------


class Upstream:
    """A runtime of the test's own: answers each request with `answer` as soon as its head
    is read, and records the heads."""

    def __init__(self, answer: bytes) -> None:
        self.answer = answer
        self.heads: list[bytes] = []
        self.server: asyncio.Server | None = None

    async def start(self) -> str:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port = self.server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                self.heads.append(head)
                writer.write(self.answer)
                await writer.drain()
                if b"Connection: close" in self.answer:
                    break
        writer.close()

    def close(self) -> None:
        if self.server is not None:
            self.server.close()


async def test_a_runtimes_connection_close_reaches_the_client_and_ends_its_connection(
    tmp_path, sim_host, fakenvml_path
):
    # ComfyUI's 500s carry `Connection: close`: the client sees it and the connection ends.
    upstream = Upstream(
        b"HTTP/1.1 500 Internal Server Error\r\nContent-Type: text/plain\r\n"
        b"Content-Length: 4\r\nConnection: close\r\n\r\noops"
    )
    url = await upstream.start()
    async with running_stack(tmp_path, sim_host, fakenvml_path, upstream=url) as stack:
        host, port = stack.gate_url.rsplit(":", 1)
        reader, writer = await asyncio.open_connection(host.split("//")[1], int(port))
        writer.write(b"GET /api/tags HTTP/1.1\r\nHost: localhost:11434\r\n\r\n")
        answer = await read_reply(reader)
        assert await closed_by_peer(reader) == b""
        writer.close()
        assert stack.gate.core.leases() == []
    upstream.close()
    assert (answer.status, answer.body, answer.headers["connection"]) == (500, b"oops", "close")


async def test_a_get_with_an_unfinished_body_is_relayed_while_it_streams(
    tmp_path, sim_host, fakenvml_path
):
    upstream = Upstream(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
    url = await upstream.start()
    async with running_stack(tmp_path, sim_host, fakenvml_path, upstream=url) as stack:
        host, port = stack.gate_url.rsplit(":", 1)
        reader, writer = await asyncio.open_connection(host.split("//")[1], int(port))
        writer.write(
            b"GET /api/tags HTTP/1.1\r\nHost: localhost:11434\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n4\r\npart\r\n"
        )
        answer = await read_reply(reader)  # before the body's end
        writer.close()
        assert stack.gate.core.leases() == []
    upstream.close()
    assert (answer.status, answer.body) == (200, b"ok")
    assert any(h.startswith(b"GET /api/tags ") for h in upstream.heads)


async def test_an_accept_out_of_descriptors_closes_the_longest_waiting_connections():
    async with serving() as served:
        waiting = [await served.connect() for _ in range(3)]
        await until(lambda: served.server.open_connections == 3)
        # What asyncio's server reports when accept() fails with EMFILE (it retries the
        # accept a second later): the loop's handler makes room for that retry.
        quiet_loop_errors(
            asyncio.get_running_loop(),
            {
                "message": "socket.accept() out of system resource",
                "exception": OSError(errno.EMFILE, "Too many open files"),
            },
        )
        closed = [await closed_by_peer(reader) for reader, _ in waiting]
        for _, writer in waiting:
            writer.close()
        assert served.server.open_connections == 0
        reader, writer = await served.connect()
        writer.write(get("/after"))
        answer = await read_reply(reader)
        writer.close()
    assert closed == [REFUSAL] * 3
    assert answer.body == b"GET /after "


async def test_a_head_sent_a_byte_at_a_time_is_read_and_a_line_past_the_limit_refused():
    async with serving() as served:
        reader, writer = await served.connect()
        for byte in get("/drip"):
            writer.write(bytes([byte]))
            await writer.drain()
        answer = await read_reply(reader)
        # A line with no end in sight, in small pieces: refused once past Go's head limit
        # (1 MiB + 4 KiB off the wire: 431).
        writer.write(b"GET /long HTTP/1.1\r\nX-Long: ")
        for _ in range(go.READ_LIMIT // 16000 + 1):
            writer.write(b"a" * 16000)
            await writer.drain()
        rest = await closed_by_peer(reader)
        writer.close()
    assert answer.body == b"GET /drip "
    assert rest == go.TOO_LARGE.data
