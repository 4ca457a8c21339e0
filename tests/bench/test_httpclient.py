"""The timing client: a stream's first body bytes come before its end, a connection the
server closes is opened again, and a body-less answer is timed to its end."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator

import pytest
from aiohttp import web

from bench.httpclient import Connection


async def stream(request: web.Request) -> web.StreamResponse:
    response = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})
    await response.prepare(request)
    await asyncio.sleep(0.02)
    await response.write(b'{"token":"a"}\n')
    await asyncio.sleep(0.05)
    await response.write(b'{"done":true}\n')
    await response.write_eof()
    return response


async def stream_end(request: web.Request) -> web.StreamResponse:
    """A stream whose connection the server closes after it, as llama-server's."""
    response = web.StreamResponse()
    await response.prepare(request)
    await response.write(b"ok")
    await response.write_eof()
    assert request.transport is not None
    request.transport.close()
    return response


async def closing(request: web.Request) -> web.Response:
    return web.Response(text="bye", headers={"Connection": "close"})


async def empty(request: web.Request) -> web.Response:
    return web.Response(status=204)


@pytest.fixture
def server() -> Iterator[str]:
    """An aiohttp server on a thread of its own (the client blocks)."""
    loop = asyncio.new_event_loop()
    app = web.Application()
    app.router.add_post("/stream", stream)
    app.router.add_post("/stream_end", stream_end)
    app.router.add_get("/closing", closing)
    app.router.add_get("/empty", empty)
    runner = web.AppRunner(app)
    loop.run_until_complete(runner.setup())
    site = web.TCPSite(runner, "127.0.0.1", 0)
    loop.run_until_complete(site.start())
    port = runner.addresses[0][1]
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)
        loop.run_until_complete(runner.cleanup())
        loop.close()


def test_first_body_bytes_come_before_the_end(server: str) -> None:
    conn = Connection(server)
    try:
        timed = conn.request("POST", "/stream", b"{}")
    finally:
        conn.close()
    assert timed.status == 200
    assert timed.body == b'{"token":"a"}\n{"done":true}\n'
    assert 0.015 < timed.first_body < timed.complete
    assert timed.complete - timed.first_body > 0.04


def test_a_closed_connection_is_opened_again(server: str) -> None:
    conn = Connection(server)
    try:
        for _ in range(3):
            timed = conn.request("GET", "/closing")
            assert (timed.status, timed.body) == (200, b"bye")
            assert conn.sock is None
        timed = conn.request("GET", "/empty")
        assert timed.status == 204 and timed.first_body == timed.complete
        # A connection that reads its end (as after the server's keep-alive timeout) is
        # found before the next request is sent, and opened again.
        assert conn.sock is not None
        conn.sock.shutdown(2)
        time.sleep(0.01)
        assert conn.request("GET", "/empty").status == 204
    finally:
        conn.close()


def test_after_a_chunked_answer_the_client_sees_whether_the_server_ended_it(
    server: str,
) -> None:
    conn = Connection(server, ends_streams=True, quick_ack=True)
    try:
        timed = conn.request("POST", "/stream", b"{}")
        kept = conn.sock
        assert timed.status == 200 and kept is not None  # aiohttp keeps it open
        assert conn.request("GET", "/empty").status == 204 and conn.sock is kept
        # A server that ends the connection after the stream: the next request opens a
        # new one, its connect inside the clock.
        assert conn.request("POST", "/stream_end", b"{}").status == 200
        assert conn.sock is None and conn._reopen_timed
        assert conn.request("GET", "/empty").status == 204 and conn.sock is not None
        assert not conn._reopen_timed
    finally:
        conn.close()
