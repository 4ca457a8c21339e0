"""Corpus A: aiohttp's server with ComfyUI's settings against the aiohttp dialect's server.

Every case goes byte for byte to both, each answering with the same echo handler; the answers
(Date normalised) and whether each closed the connection must be identical.
"""

from __future__ import annotations

import asyncio
import logging

import pytest

from gpugate.proxy.dialects.aiohttp import DIALECT, SERVER
from gpugate.proxy.dialects.base import Refusal, RequestHead
from tests.dialects import aiohttp_reference, dialect_server
from tests.dialects.corpus_aiohttp import corpus
from tests.dialects.harness import Case, Outcome, exchange

PARALLEL = 16


async def _both(cases: list[Case]) -> list[tuple[Case, Outcome, Outcome]]:
    gate = asyncio.Semaphore(PARALLEL)
    async with (
        aiohttp_reference.running() as real,
        dialect_server.running(DIALECT, dialect_server.echo) as ours,
    ):

        async def one(case: Case) -> tuple[Case, Outcome, Outcome]:
            async with gate:
                first = await exchange("127.0.0.1", real, case)
                return case, first, await exchange("127.0.0.1", ours, case)

        return await asyncio.gather(*(one(case) for case in cases))


async def test_corpus_has_no_differences(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.CRITICAL)
    cases = corpus()
    assert len(cases) >= 500
    results = await _both(cases)
    differences = [(case.name, real, ours) for case, real, ours in results if real != ours]
    assert differences == []
    # The corpus reaches what aiohttp decides itself, not only happy paths.
    refused = [real for _, real, _ in results if real.data.startswith(b"HTTP/1.0 400 Bad Request")]
    served = [real for _, real, _ in results if b" 200 OK\r\n" in real.data]
    closed = [real for _, real, _ in results if real.closed]
    assert len(refused) > 100 and len(served) > 100 and len(closed) > 100
    assert not any(real.stalled for _, real, _ in results)
    # ComfyUI's 500s: Connection: close on 1.1, and closed.
    boom = next(real for case, real, _ in results if case.name == "handler error")
    assert boom.closed and b"\r\nConnection: close\r\n" in boom.data


def test_refusal_bytes() -> None:
    date = b"Mon, 01 Jan 2001 00:00:00 GMT"
    refusal = DIALECT.read_head(b"GET / HTTP/1.2\r\n\r\n", date)
    assert isinstance(refusal, Refusal) and refusal.close
    assert refusal.data.startswith(
        b"HTTP/1.0 400 Bad Request\r\nContent-Type: text/plain; charset=utf-8\r\n"
    )
    assert b"\r\nServer: " + SERVER.encode() + b"\r\n\r\nBad status line:" in refusal.data


def test_head_waits_and_reads() -> None:
    date = b"D"
    assert DIALECT.read_head(b"GET / HTTP/1.1\r\nHost: h\r\n", date) is None
    head = DIALECT.read_head(b"GET /x HTTP/1.0\r\nA: 1\r\n\r\n", date)
    assert isinstance(head, RequestHead)
    assert (head.method, head.target, head.version, head.keep_alive) == ("GET", "/x", (1, 0), False)
    assert head.size == len(b"GET /x HTTP/1.0\r\nA: 1\r\n\r\n")
    # aiohttp refuses bytes after a request that closes the connection.
    late = DIALECT.read_head(b"GET /x HTTP/1.0\r\n\r\nnext", date)
    assert isinstance(late, Refusal) and b"Data after `Connection: close`" in late.data
    kept = DIALECT.read_head(b"GET /x HTTP/1.1\r\nHost: h\r\n\r\nGET", date)
    assert isinstance(kept, RequestHead) and kept.keep_alive and kept.size == 28


def test_answer_head_runtime_server_and_close() -> None:
    head = DIALECT.answer_head(
        500,
        [("Content-Type", "text/plain; charset=utf-8"), ("Server", "Python/3.12 aiohttp/3.11.18")],
        b"D",
        length=5,
        close=True,
    )
    assert head == (
        b"HTTP/1.1 500 Internal Server Error\r\nContent-Type: text/plain; charset=utf-8\r\n"
        b"Content-Length: 5\r\nDate: D\r\nServer: Python/3.12 aiohttp/3.11.18\r\n"
        b"Connection: close\r\n\r\n"
    )
    kept = DIALECT.answer_head(200, [], b"D", length=None, close=False, version=(1, 0))
    assert kept.startswith(b"HTTP/1.0 200 OK\r\nTransfer-Encoding: chunked\r\n")
    assert kept.endswith(b"\r\nConnection: keep-alive\r\n\r\n")


def test_chunk_reader_leaves_the_next_request() -> None:
    reader = DIALECT.chunks()
    first = reader.feed(b"3\r\nab", b"D")
    assert (first.data, first.done) == (b"ab", False)
    rest = reader.feed(b"c\r\n0\r\n\r\nGET", b"D")
    assert (rest.data, rest.done, rest.used) == (b"c", True, 8)
    bad = DIALECT.chunks().feed(b"zz\r\nabc\r\n", b"D")
    assert bad.refusal is not None and bad.refusal.close
    assert bad.refusal.data.startswith(b"HTTP/1.0 400 Bad Request\r\n")
