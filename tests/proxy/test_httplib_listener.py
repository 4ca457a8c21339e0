"""The listener as cpp-httplib's server: when it writes `100 Continue` (0.20: as the
request is dispatched), how many requests a connection carries (100, the last answered
`Connection: close`), and a refusal that keeps the connection dropping what came with it.
The same rules are held to the real servers through the gate in tests/dialects
(test_httplib_llama.py, test_httplib_whisper.py)."""

from __future__ import annotations

import asyncio

from gpugate.proxy.dialects import httplib
from gpugate.proxy.relay import send_answer
from gpugate.proxy.request import Request
from tests.listeners.wire import READ_TIMEOUT
from tests.proxy.test_continue import CONTINUE, POST, exchange, refuse, serving


async def test_whisper_invites_at_dispatch_a_body_that_came_with_the_head():
    interim, status, body = await exchange(httplib.WHISPER, POST + b"hello")
    assert (interim, status, body) == (CONTINUE, 200, b"POST /up hello")


async def test_whisper_invites_a_body_its_handler_never_reads():
    interim, status, _ = await exchange(httplib.WHISPER, POST + b"hello", refuse)
    assert (interim, status) == (CONTINUE, 403)


async def ok(request: Request) -> None:
    send_answer(request, 200, [], b"ok")


async def _answer(reader: asyncio.StreamReader) -> bytes:
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), READ_TIMEOUT)
    await asyncio.wait_for(reader.readexactly(2), READ_TIMEOUT)
    return head


async def test_the_hundredth_request_is_answered_with_close_and_the_last():
    for dialect in (httplib.DIALECT, httplib.WHISPER):
        async with serving(dialect, ok) as port:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            heads = []
            for _ in range(httplib.KEEPALIVE_MAX_COUNT):
                writer.write(b"GET / HTTP/1.1\r\nHost: h\r\n\r\n")
                heads.append(await _answer(reader))
            assert all(b"\r\nKeep-Alive: timeout=5, max=100\r\n" in h for h in heads[:-1])
            assert b"\r\nConnection: close\r\n" in heads[-1]
            assert b"Keep-Alive" not in heads[-1]
            assert await asyncio.wait_for(reader.read(), READ_TIMEOUT) == b""
            writer.close()


async def test_a_refusal_that_keeps_the_connection_drops_what_came_with_it():
    async with serving(httplib.WHISPER, ok) as port:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        # a bad request line, and bytes after it in the same write: no blank line ends them
        writer.write(b"\x16\x03\x01 x\r\nGET / HTTP/1.1\r\nHost: h\r\n")
        refused = await asyncio.wait_for(reader.readuntil(b"Invalid request"), READ_TIMEOUT)
        assert refused.startswith(b"HTTP/1.1 400 Bad Request\r\n")
        # the next request comes in bytes of its own, and is read from its first byte
        writer.write(b"GET / HTTP/1.1\r\nHost: h\r\n\r\n")
        head = await _answer(reader)
        assert head.startswith(b"HTTP/1.1 200 OK\r\n")
        writer.close()


async def test_a_half_close_once_the_request_went_up_still_gets_the_answer():
    # cpp-httplib reads nothing more while its handler runs: the client that ended its
    # side still gets the answer, the runtime is told (`on_end`), then the connection ends.
    told = asyncio.Event()
    ended = asyncio.Event()
    sent_up = asyncio.Event()

    async def forwarded(request: Request) -> None:
        request.forwarded = True  # as forward.py's open_upstream marks it
        request.on_end = told.set
        sent_up.set()
        if not request.ended:
            await told.wait()
        ended.set()
        send_answer(request, 200, [], b"ok")

    for dialect in (httplib.DIALECT, httplib.WHISPER):
        told.clear()
        ended.clear()
        sent_up.clear()
        async with serving(dialect, forwarded) as port:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"GET / HTTP/1.1\r\nHost: h\r\n\r\n")
            await asyncio.wait_for(sent_up.wait(), READ_TIMEOUT)
            writer.write_eof()
            answer = await asyncio.wait_for(reader.read(), READ_TIMEOUT)
            assert ended.is_set()
            assert answer.startswith(b"HTTP/1.1 200 OK\r\n") and answer.endswith(b"\r\n\r\nok")
            writer.close()


async def test_a_half_close_while_the_request_is_in_the_gates_hands_ends_it():
    # Waiting for a lease or a start is the gate's, not the runtime's: the client's end is
    # its going, and the handler is cancelled (its lease or ticket released), as before.
    waiting = asyncio.Event()
    cancelled = asyncio.Event()

    async def queued(request: Request) -> None:
        waiting.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise

    async with serving(httplib.DIALECT, queued) as port:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET / HTTP/1.1\r\nHost: h\r\n\r\n")
        await asyncio.wait_for(waiting.wait(), READ_TIMEOUT)
        writer.write_eof()
        assert await asyncio.wait_for(reader.read(), READ_TIMEOUT) == b""
        await asyncio.wait_for(cancelled.wait(), READ_TIMEOUT)
        writer.close()


async def test_a_request_and_its_clients_end_in_one_write_are_answered():
    # The end came before the gate did anything for the request: it goes up, the
    # runtime is told at once, and the answer goes down.
    seen: list[bool] = []

    async def forwarded(request: Request) -> None:
        seen.append(request.ended)
        request.forwarded = True
        send_answer(request, 200, [], b"ok")

    async with serving(httplib.DIALECT, forwarded) as port:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET / HTTP/1.1\r\nHost: h\r\n\r\n")
        writer.write_eof()
        answer = await asyncio.wait_for(reader.read(), READ_TIMEOUT)
        assert answer.startswith(b"HTTP/1.1 200 OK\r\n") and answer.endswith(b"\r\n\r\nok")
        assert len(seen) == 1
        writer.close()
