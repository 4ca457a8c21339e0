"""What goes down the wire through the gate is what Ollama sends: bytes and headers."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging

import aiohttp

from tests.gate.harness import running_stack
from tests.proxy.conftest import ask

HOST = {"Host": "localhost:11434"}


async def test_answers_carry_ollamas_headers_and_no_server_software(stack):
    bad_keep_alive = json.dumps({"model": "llama3.2:3b", "prompt": "x", "keep_alive": "x"})
    async with aiohttp.ClientSession(skip_auto_headers=["Content-Type"]) as session:
        cases = [
            ("POST", "/api/generate", b""),  # Content-Length: 0
            ("HEAD", "/", None),
            ("GET", "/", None),
            ("GET", "/api/tags", None),
            ("POST", "/api/generate", bad_keep_alive.encode()),  # the gate's own answer
            ("PROPFIND", "/", None),
            ("DELETE", "/api/tags", None),
            ("PROPFIND", "/nope", None),
        ]
        for method, path, body in cases:
            direct = await ask(session, stack.sim_url, method, path, HOST, body)
            gated = await ask(session, stack.gate_url, method, path, HOST, body)
            assert gated == direct, (method, path)
            assert gated.server is None
    assert stack.gate.core.leases() == []


async def test_empty_body_and_head_match_ollama(stack):
    async with aiohttp.ClientSession() as session:
        empty = await ask(session, stack.gate_url, "POST", "/api/generate", HOST, b"")
        assert (empty.status, empty.body) == (400, b'{"error":"missing request body"}')
        head = await ask(session, stack.gate_url, "HEAD", "/", HOST)
        assert (head.status, head.content_length, head.body) == (200, "17", b"")
        unknown = await ask(session, stack.gate_url, "PROPFIND", "/api/tags", HOST)
        assert (unknown.status, unknown.body) == (405, b"405 method not allowed")
        assert dict(unknown.cors)["Allow"] == ("HEAD, GET",)


async def test_a_gate_error_reply_has_ollamas_headers(stack, caplog):
    caplog.set_level(logging.DEBUG)
    async with aiohttp.ClientSession() as session:
        body = json.dumps({"model": "llama3.2:3b", "prompt": "x", "keep_alive": "x"})
        async with session.post(stack.gate_url + "/api/generate", data=body) as resp:
            assert resp.status == 400
            assert resp.headers["Content-Type"] == "application/json; charset=utf-8"
            assert resp.headers["Content-Length"] == str(len(await resp.read()))
            assert "Date" in resp.headers and "Server" not in resp.headers
    assert [r for r in caplog.records if r.exc_info] == []


async def test_a_whole_answer_keeps_the_runtimes_header_lines_byte_for_byte(
    tmp_path, sim_host, fakenvml_path
):
    body = b'{"models":[]}'
    answer = (
        b"HTTP/1.1 200 OK\r\n"
        b"content-type: application/json; charset=utf-8\r\n"
        b"X-Mixed-Case: One\r\n"
        b"Set-Cookie: a=1\r\n"
        b"Connection: keep-alive, X-Hop\r\n"
        b"X-Hop: nominated by Connection\r\n"
        b"Keep-Alive: timeout=5\r\n"
        b"Set-Cookie: b=2\r\n"
        b"Server: runtime/1.0\r\n"
        b"Content-Length: %d\r\n\r\n%b" % (len(body), body)
    )

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
            while await reader.readuntil(b"\r\n\r\n"):
                writer.write(answer)
                await writer.drain()
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    upstream = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    async with running_stack(tmp_path, sim_host, fakenvml_path, upstream=upstream) as stack:
        host, port = stack.gate_url.removeprefix("http://").split(":")
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(b"GET /api/version HTTP/1.1\r\nHost: localhost:11434\r\n\r\n")
        head = await reader.readuntil(b"\r\n\r\n")
        assert await reader.readexactly(len(body)) == body
        writer.close()
    server.close()
    assert head == (
        b"HTTP/1.1 200 OK\r\n"
        b"content-type: application/json; charset=utf-8\r\n"
        b"X-Mixed-Case: One\r\n"
        b"Set-Cookie: a=1\r\n"
        b"Set-Cookie: b=2\r\n"
        b"Server: runtime/1.0\r\n"
        b"Content-Length: %d\r\n\r\n" % len(body)
    )
