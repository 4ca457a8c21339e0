"""Corpus U: uvicorn (httptools protocol, vLLM's settings) against the uvicorn dialect's server.

Every case goes byte for byte to both: the real uvicorn under uvloop serving an ASGI echo
(tests/dialects/uvicorn_reference.py, a child process) and dialect_server driven by the
uvicorn dialect with the same echo; the answers (Date normalised) and whether each closed
the connection must be identical.
"""

from __future__ import annotations

import asyncio
import logging

import httptools
import pytest

from gpugate.proxy.dialects import dialect_of
from gpugate.proxy.dialects.base import Framing, Refusal, RequestHead
from gpugate.proxy.dialects.uvicorn import DIALECT, INVALID, MAX_HEAD
from gpugate.runtimes.dialect import ServerDialect
from gpugate.runtimes.vllm.adapter import VllmReading
from tests.dialects import dialect_server, uvicorn_reference
from tests.dialects.corpus_uvicorn import corpus
from tests.dialects.dialect_server import Answer
from tests.dialects.harness import Case, Outcome, exchange

PARALLEL = 16
SECONDS = 10.0
"""Per case: every case is answered or closed at once, none waits on a timer."""
TEXT = ("content-type", "text/plain; charset=utf-8")
BOOM = b"Internal Server Error"


def echo(head: RequestHead, body: bytes) -> Answer:
    """uvicorn_reference.echo from the dialect's head: the target as the app's scope has it
    (httptools' `parse_url` path and query), uvicorn's own 500 for `/boom`."""
    url = httptools.parse_url(head.target.encode("latin-1"))
    target = url.path + (b"?" + url.query if url.query else b"")
    if url.path.startswith(b"/boom"):
        fields = [TEXT, ("content-length", "21"), ("connection", "close")]
        return Answer(500, fields, BOOM, close=True)
    text = dialect_server.echo_text(
        head.method, target.decode("latin-1"), head.version, head.headers, body
    )
    return Answer(200, [TEXT], text)


async def _both(cases: list[Case]) -> list[tuple[Case, Outcome, Outcome]]:
    gate = asyncio.Semaphore(PARALLEL)
    with uvicorn_reference.running() as real:
        async with dialect_server.running(DIALECT, echo) as ours:

            async def one(case: Case) -> tuple[Case, Outcome, Outcome]:
                async with gate:
                    first = await exchange("127.0.0.1", real, case, seconds=SECONDS)
                    return case, first, await exchange("127.0.0.1", ours, case, seconds=SECONDS)

            return await asyncio.gather(*(one(case) for case in cases))


async def test_corpus_has_no_differences(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.CRITICAL)
    cases = corpus()
    assert len(cases) >= 500
    results = await _both(cases)
    differences = [(case.name, real, ours) for case, real, ours in results if real != ours]
    assert differences == []
    # The corpus reaches what uvicorn decides itself, not only happy paths.
    refused = [real for _, real, _ in results if real.data.endswith(INVALID)]
    served = [real for _, real, _ in results if b" 200 OK\r\n" in real.data]
    closed = [real for _, real, _ in results if real.closed]
    continued = [real for _, real, _ in results if real.data.startswith(b"HTTP/1.1 100 ")]
    assert len(refused) > 100 and len(served) > 100 and len(closed) > 100
    assert len(continued) >= 5
    assert not any(real.stalled for _, real, _ in results)
    boom = next(real for case, real, _ in results if case.name == "boom then get")
    assert boom.closed and boom.data.endswith(b"\r\nconnection: close\r\n\r\n" + BOOM)


DATE = b"Mon, 01 Jan 2001 00:00:00 GMT"


def test_refusal_bytes() -> None:
    refusal = DIALECT.read_head(b"GET / HTTP/1.2\r\n\r\n", DATE)
    assert refusal == Refusal(
        b"HTTP/1.1 400 Bad Request\r\ndate: " + DATE + b"\r\nserver: uvicorn\r\n"
        b"content-type: text/plain; charset=utf-8\r\ncontent-length: 30\r\n"
        b"connection: close\r\n\r\nInvalid HTTP request received.",
        close=True,
    )


def test_head_reading() -> None:
    head = DIALECT.read_head(
        b"\r\nGET /x HTTP/1.0\r\nConnection: keep-alive\r\nA: 1 \r\n\r\nG", DATE
    )
    assert isinstance(head, RequestHead)
    assert (head.method, head.target, head.version, head.keep_alive) == ("GET", "/x", (1, 0), False)
    assert head.headers == (("connection", "keep-alive"), ("a", "1"))
    assert head.size == len(b"\r\nGET /x HTTP/1.0\r\nConnection: keep-alive\r\nA: 1 \r\n\r\n")
    assert DIALECT.read_head(b"GET /v\r\n", DATE) is None  # fields may follow
    old = DIALECT.read_head(b"GET /v\r\nX: y\r\n\r\nGET", DATE)
    assert isinstance(old, RequestHead) and (old.version, old.size) == ((0, 9), 16)
    chunked = DIALECT.read_head(
        b"POST / HTTP/1.0\r\nTransfer-Encoding: gzip, chunked\r\n\r\n", DATE
    )
    assert isinstance(chunked, RequestHead) and chunked.framing is Framing.CHUNKED
    sized = DIALECT.read_head(b"POST / HTTP/1.1\r\nContent-Length:  3 \r\n\r\n", DATE)
    assert isinstance(sized, RequestHead) and (sized.framing, sized.length) == (Framing.LENGTH, 3)
    expect = DIALECT.read_head(b"GET / HTTP/1.0\r\nExpect: 100-Continue\r\n\r\n", DATE)
    assert isinstance(expect, RequestHead) and expect.expect_continue
    ws = b"GET /ws HTTP/1.1\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n"
    upgrade = DIALECT.read_head(ws, DATE)
    assert isinstance(upgrade, RequestHead) and upgrade.upgrade and upgrade.keep_alive
    h2c = DIALECT.read_head(ws.replace(b"websocket", b"h2c"), DATE)
    assert isinstance(h2c, RequestHead) and not h2c.upgrade and not h2c.keep_alive
    # httptools' parse_url refuses an authority and bytes past ASCII: uvicorn's 400.
    for target in (b"h:80", b"/\xc3\xa9"):
        refusal = DIALECT.read_head(b"GET " + target + b" HTTP/1.1\r\n\r\n", DATE)
        assert isinstance(refusal, Refusal) and refusal.data.endswith(INVALID), target


def test_head_bound() -> None:
    """uvicorn has no head limit; the listener's is MAX_HEAD, answered with uvicorn's 400."""
    head = b"GET / HTTP/1.1\r\nCookie: " + b"c" * (MAX_HEAD - 100)
    assert DIALECT.read_head(head, DATE) is None
    refusal = DIALECT.read_head(head + b"c" * 200, DATE)
    assert isinstance(refusal, Refusal) and refusal.close and refusal.data.endswith(INVALID)
    whole = DIALECT.read_head(head + b"\r\n\r\n", DATE)
    assert isinstance(whole, RequestHead) and whole.size == len(head) + 4


def test_answer_head() -> None:
    fields = [("Content-Type", "application/json"), ("X-GPUGate-Reason", "busy")]
    assert DIALECT.answer_head(503, fields, b"D", length=5, close=False, version=(1, 0)) == (
        b"HTTP/1.1 503 Service Unavailable\r\ndate: D\r\nserver: uvicorn\r\n"
        b"x-gpugate-reason: busy\r\ncontent-length: 5\r\ncontent-type: application/json\r\n\r\n"
    )
    chunked = DIALECT.answer_head(200, [], b"D", length=None, close=True)
    assert chunked.endswith(
        b"server: uvicorn\r\nconnection: close\r\ntransfer-encoding: chunked\r\n\r\n"
    )


def test_chunk_reader_leaves_the_next_request() -> None:
    reader = DIALECT.chunks()
    first = reader.feed(b"3\r\nab", DATE)
    assert (first.data, first.done) == (b"ab", False)
    rest = reader.feed(b"c\r\n0\r\n\r\nGET", DATE)
    assert (rest.data, rest.done, rest.used) == (b"c", True, 8)
    bad = DIALECT.chunks().feed(b"zz\r\nabc\r\n", DATE)
    assert bad.refusal is not None and bad.refusal.close and bad.refusal.data.endswith(INVALID)


def test_vllm_reads_as_uvicorn() -> None:
    assert VllmReading.dialect is ServerDialect.UVICORN
    assert dialect_of(ServerDialect.UVICORN) is DIALECT
    # uvicorn closes an idle connection 5 s after its last answer: the gate reuses for 2 s
    assert VllmReading.keep_alive.idle_timeout == 5.0
    assert VllmReading.keep_alive.reuse_within == 2.0
    assert VllmReading.keep_alive.announcement is None
