"""When the listener writes `100 Continue`: each dialect's server's own rule
(`ContinueRule`), whether or not the body came with the head.

Go's net/http writes it on the handler's first read of the body, buffered or not, unless
the answer has begun (server.go `expectContinueReader`); aiohttp's as the request reaches
its handler, whatever the handler does (web_urldispatcher.py `_default_expect_handler`);
cpp-httplib's, as the gate has it, only when the handler waits for a body none of which
came yet.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable

from gpugate.proxy.dialects import aiohttp, go, httplib
from gpugate.proxy.dialects.base import HttpDialect
from gpugate.proxy.relay import send_answer
from gpugate.proxy.request import Request
from gpugate.proxy.runners import ListenerRunner
from tests.listeners.wire import READ_TIMEOUT
from tests.proxy.test_server import LIMITS, echo

CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
POST = b"POST /up HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\n"


async def refuse(request: Request) -> None:
    """Answer without reading the body."""
    send_answer(request, 403, [], b"")


@contextlib.asynccontextmanager
async def serving(
    dialect: HttpDialect, handler: Callable[[Request], Awaitable[None]] = echo
) -> AsyncIterator[int]:
    async def nothing() -> None:
        return None

    runner = ListenerRunner(handler, dialect, nothing, LIMITS, "test listener", 64)
    await runner.start("127.0.0.1", 0)
    try:
        yield runner.addresses[0][1]
    finally:
        await runner.drain(1.0)
        await runner.cleanup()


async def exchange(
    dialect: HttpDialect, data: bytes, handler: Callable[[Request], Awaitable[None]] = echo
) -> tuple[bytes, int, bytes]:
    """What comes before the answer's status line, the answer's status and body."""
    async with serving(dialect, handler) as port:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(data)
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), READ_TIMEOUT)
        interim = b""
        if head == CONTINUE:
            interim = head
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), READ_TIMEOUT)
        status = int(head.split(b" ")[1])
        length = 0
        for line in head.split(b"\r\n"):
            name, _, value = line.partition(b":")
            if name.lower() == b"content-length":
                length = int(value)
        body = await asyncio.wait_for(reader.readexactly(length), READ_TIMEOUT)
        writer.close()
    return interim, status, body


async def test_go_invites_a_body_that_came_with_the_head_when_the_handler_reads_it():
    interim, status, body = await exchange(go.DIALECT, POST + b"hello")
    assert (interim, status, body) == (CONTINUE, 200, b"POST /up hello")


async def test_go_does_not_invite_a_body_the_handler_answers_without():
    interim, status, _ = await exchange(go.DIALECT, POST + b"hello", refuse)
    assert (interim, status) == (b"", 403)


async def test_go_does_not_invite_an_http10_body():
    data = POST.replace(b"HTTP/1.1", b"HTTP/1.0") + b"hello"
    interim, status, _ = await exchange(go.DIALECT, data, refuse)
    assert (interim, status) == (b"", 403)


async def test_aiohttp_invites_as_the_request_reaches_its_handler_body_or_not():
    interim, status, _ = await exchange(aiohttp.DIALECT, POST + b"hello", refuse)
    assert (interim, status) == (CONTINUE, 403)  # the handler never read the body


async def test_aiohttp_invites_a_request_without_a_body():
    data = b"GET /a HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\n\r\n"
    interim, status, body = await exchange(aiohttp.DIALECT, data)
    assert (interim, status, body) == (CONTINUE, 200, b"GET /a ")


async def test_aiohttp_does_not_invite_an_http10_request():
    data = POST.replace(b"HTTP/1.1", b"HTTP/1.0") + b"hello"
    interim, status, _ = await exchange(aiohttp.DIALECT, data, refuse)
    assert (interim, status) == (b"", 403)


async def test_httplib_invites_only_a_body_none_of_which_came_with_the_head():
    interim, status, body = await exchange(httplib.DIALECT, POST + b"hello")
    assert (interim, status, body) == (b"", 200, b"POST /up hello")
