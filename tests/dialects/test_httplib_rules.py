"""The httplib dialect's rules that need no server: header order, chunk sizes, refusals."""

from __future__ import annotations

from gpugate.proxy.dialects.base import Framing, Refusal, RequestHead
from gpugate.proxy.dialects.httplib import DIALECT, WHISPER
from gpugate.proxy.dialects.httplib_chunked import _strtoul16
from gpugate.proxy.dialects.httplib_order import _HeaderTable


def test_whisper_header_order_is_libstdcxx_bucket_order() -> None:
    # As whisper-server writes /health (seen on the real build).
    head = WHISPER.answer_head(
        200, [("Content-Type", "application/json")], b"", length=15, close=False
    )
    assert head.split(b"\r\n")[1:7] == [
        b"Keep-Alive: timeout=5, max=100",
        b"Content-Type: application/json",
        b"Server: whisper.cpp",
        b"Content-Length: 15",
        b"Access-Control-Allow-Origin: *",
        b"Access-Control-Allow-Headers: content-type, authorization",
    ]
    table = _HeaderTable.of([("A", "1")])
    for index in range(40):
        table.add(f"X-{index}", str(index))
    assert table.buckets > 13 and len(table.nodes) == 41


def test_llama_answer_head_in_insertion_order() -> None:
    head = DIALECT.answer_head(
        503,
        [("Access-Control-Allow-Origin", ""), ("Content-Type", "application/json")],
        b"",
        length=2,
        close=False,
    )
    assert head == (
        b"HTTP/1.1 503 Service Unavailable\r\nServer: llama.cpp\r\n"
        b"Access-Control-Allow-Origin: \r\nContent-Type: application/json\r\n"
        b"Content-Length: 2\r\nConnection: close\r\n\r\n"
    )


def test_strtoul_sizes() -> None:
    assert _strtoul16(b"1a;x=y") == 26
    assert _strtoul16(b"  0x10") == 16
    assert _strtoul16(b"3zz") == 3
    assert _strtoul16(b"-3") == 2**64 - 3
    assert _strtoul16(b"zz") is None
    assert _strtoul16(b"f" * 17) is None


def test_refusals_and_framing() -> None:
    bad = DIALECT.read_head(b"GET / HTTP/1.2\r\n", b"")
    assert bad == Refusal(
        b"HTTP/1.1 400 Bad Request\r\nServer: llama.cpp\r\nConnection: close\r\n"
        b"Content-Length: 0\r\n\r\n",
        close=False,
    )
    mixed = DIALECT.read_head(
        b"POST / HTTP/1.1\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n", b""
    )
    assert isinstance(mixed, Refusal) and mixed.close
    whisper = WHISPER.read_head(
        b"POST / HTTP/1.1\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n", b""
    )
    assert isinstance(whisper, RequestHead) and whisper.framing is Framing.CHUNKED
    to_close = WHISPER.read_head(b"POST / HTTP/1.1\r\n\r\n", b"")
    assert isinstance(to_close, RequestHead) and to_close.framing is Framing.UNTIL_CLOSE
    assert WHISPER.read_head(b"GET / HTTP/1.1\r\nHost: h\r\n", b"") is None


def test_chunk_reader() -> None:
    reader = WHISPER.chunks()
    got = reader.feed(b"3\r\nabc\r\n0\r\n\r\nnext", b"")
    assert (got.data, got.used, got.done, got.refusal) == (b"abc", 13, True, None)
    broken = WHISPER.chunks().feed(b"3\r\nabcX\r\n", b"")
    assert broken.refusal is not None and not broken.refusal.close
    assert broken.refusal.data.endswith(b"\r\n\r\nInvalid request")
