"""What goes down the wire through the gate is what Ollama sends: bytes and headers."""

from __future__ import annotations

import json
import logging

import aiohttp

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
