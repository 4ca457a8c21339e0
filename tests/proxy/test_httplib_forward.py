"""The head the gate sends a cpp-httplib runtime stays one its server reads whenever the
client's was (`HttplibDialect.fits`, checked with the dialect's own reading, which the
dialect corpora hold to the real servers): past llama-server's 100 fields the
X-Forwarded-For is left out, then the Host the client did not send. And the head of an
answer relayed back keeps cpp-httplib's order."""

from __future__ import annotations

from gpugate.proxy.dialects import httplib
from gpugate.proxy.dialects.base import RequestHead
from gpugate.proxy.relay import CHUNKED_LINE, runtime_head
from tests.proxy.test_forwarded_head import sent
from tests.proxy.test_keepalive import answer


def fields(count: int, host: bool) -> bytes:
    lines = b"".join(b"X-%d: v\r\n" % i for i in range(count))
    return b"GET /health HTTP/1.1\r\n" + (b"Host: h\r\n" if host else b"") + lines + b"\r\n"


def test_a_head_llama_server_reads_goes_up_as_one_it_reads():
    for count, host in ((98, True), (99, True), (99, False), (100, False)):
        client = fields(count, host)
        assert isinstance(httplib.DIALECT.read_head(client, b"-"), RequestHead)
        up = sent(httplib.DIALECT, client)
        assert httplib.DIALECT.fits(up)
        assert isinstance(httplib.DIALECT.read_head(up, b"-"), RequestHead)
        names = [line.split(b":")[0] for line in up.split(b"\r\n")[1:-2]]
        assert names.count(b"Host") == (1 if host or count < 100 else 0)
        # the Host and the X-Forwarded-For beside the client's fields
        assert (b"X-Forwarded-For" in names) == (count + 2 <= httplib.HEADER_MAX_COUNT)


def test_whisper_server_counts_no_fields():
    up = sent(httplib.WHISPER, fields(300, False))
    assert up.count(b"\r\nHost: ") == 1 and b"\r\nX-Forwarded-For: " in up


def test_a_field_line_past_8192_bytes_is_not_read():
    near = b"GET / HTTP/1.1\r\nX: " + b"v" * (httplib.HEADER_MAX_LENGTH - 5) + b"\r\n\r\n"
    assert httplib.WHISPER.fits(near)
    assert not httplib.WHISPER.fits(near.replace(b"X: ", b"X:  "))


STREAM_HEAD = (
    (b"Server", b"llama.cpp"),
    (b"Access-Control-Allow-Origin", b""),
    (b"X-Accel-Buffering", b"no"),
    (b"Content-Type", b"text/event-stream"),
    (b"Transfer-Encoding", b"chunked"),
    (b"Keep-Alive", b"timeout=5, max=100"),
)
"""The head of a streamed `/completion` as the real llama-server wrote it."""


def test_a_relayed_stream_keeps_llama_servers_order():
    """The gate's chunking and the client's connection line take the places cpp-httplib
    gave them (relay.py `runtime_head`), whatever the runtime said to the gate."""
    upstream = answer(*STREAM_HEAD)
    for line, wanted in (
        (b"Keep-Alive: timeout=5, max=100\r\n", b"Keep-Alive: timeout=5, max=100"),
        (b"Connection: close\r\n", b"Connection: close"),
    ):
        head = runtime_head(upstream, (), CHUNKED_LINE, connection=line)
        assert head == (
            b"HTTP/1.1 200 OK\r\nServer: llama.cpp\r\nAccess-Control-Allow-Origin: \r\n"
            b"X-Accel-Buffering: no\r\nContent-Type: text/event-stream\r\n"
            b"Transfer-Encoding: chunked\r\n" + wanted + b"\r\n\r\n"
        )
