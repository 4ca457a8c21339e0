"""The head the gate sends upstream (proxy/forward.py `request_head`): an absolute-form
target as the client sent it where the runtime's server takes that form, and a head the
runtime's aiohttp takes whenever the client's was taken (`AiohttpDialect.fits`, checked
against aiohttp's own parser)."""

from __future__ import annotations

from types import SimpleNamespace

from hypothesis import given, settings
from hypothesis import strategies as st

from gpugate.proxy.dialects import aiohttp, go, httplib
from gpugate.proxy.dialects.aiohttp import MAX_FIELD_SIZE, MAX_HEADERS
from gpugate.proxy.dialects.base import HttpDialect, RequestHead
from gpugate.proxy.forward import request_head
from gpugate.proxy.request import Body, Request
from gpugate.runtimes.ollama.host import OllamaHostCheck

UPSTREAM = b"127.0.0.1:8188"
PEER = "127.0.0.1"


def request(dialect: HttpDialect, data: bytes) -> Request:
    head = dialect.read_head(data, b"-")
    assert isinstance(head, RequestHead), head
    conn = SimpleNamespace(client=PEER, dialect=dialect, transport=None)
    return Request(conn, head, Body(conn, 0, exists=False))  # type: ignore[arg-type]


def sent(dialect: HttpDialect, data: bytes, *, as_sent: bool = True) -> bytes:
    return request_head(
        request(dialect, data),
        UPSTREAM,
        length=None,
        chunked=False,
        close=False,
        target_as_sent=as_sent,
    )


ABSOLUTE = b"GET http://localhost:11434/api/version?x=1 HTTP/1.1\r\nHost: localhost:11434\r\n\r\n"


def test_go_and_aiohttp_get_an_absolute_form_target_as_sent():
    for dialect in (go.DIALECT, aiohttp.DIALECT):
        line = sent(dialect, ABSOLUTE).split(b"\r\n")[0]
        assert line == b"GET http://localhost:11434/api/version?x=1 HTTP/1.1"


def test_the_gate_routes_an_absolute_form_target_on_its_path():
    routed = request(go.DIALECT, ABSOLUTE)
    assert (routed.path, routed.query, routed.raw_path) == (
        "/api/version",
        "x=1",
        "/api/version?x=1",
    )
    # the authority ends at a "?" as well as at a "/" (RFC 3986 3.2)
    query_only = request(aiohttp.DIALECT, b"GET http://h?a=/b HTTP/1.1\r\nHost: h\r\n\r\n")
    assert (query_only.path, query_only.query) == ("/", "a=/b")


def test_httplib_and_a_screened_target_get_the_origin_form():
    line = sent(httplib.DIALECT, ABSOLUTE).split(b"\r\n")[0]
    assert line == b"GET /api/version?x=1 HTTP/1.1"
    line = sent(go.DIALECT, ABSOLUTE, as_sent=False).split(b"\r\n")[0]
    assert line == b"GET /api/version?x=1 HTTP/1.1"


def test_ollama_screening_sends_up_as_sent_only_a_host_the_loopback_check_allows():
    headers = {"Host": "localhost:11434"}
    everywhere = OllamaHostCheck("0.0.0.0")  # checks no Host itself
    evil = everywhere.screen("GET", headers, target="http://evil.example/api/tags")
    assert evil.reply is None and not evil.target_as_sent
    local = everywhere.screen("GET", headers, target="http://localhost:11434/api/tags")
    assert local.reply is None and local.target_as_sent
    loopback = OllamaHostCheck("127.0.0.1")
    refused = loopback.screen("GET", headers, target="http://evil.example/api/tags")
    assert refused.reply is not None and refused.reply.status == 403


def test_x_forwarded_for_goes_up_where_the_head_has_room():
    data = b"GET / HTTP/1.1\r\nHost: h\r\nX-A: 1\r\n\r\n"
    assert sent(aiohttp.DIALECT, data) == (
        b"GET / HTTP/1.1\r\nHost: 127.0.0.1:8188\r\nX-A: 1\r\nX-Forwarded-For: 127.0.0.1\r\n\r\n"
    )


def test_a_long_last_name_leaves_no_room_for_x_forwarded_for():
    # aiohttp measures a name with the name before it: 8,186 + 15 > 8,190
    name = b"N" * 8186
    data = b"GET / HTTP/1.1\r\nHost: h\r\n" + name + b": v\r\n\r\n"
    assert aiohttp.DIALECT.fits(data)
    up = sent(aiohttp.DIALECT, data)
    assert up == b"GET / HTTP/1.1\r\nHost: 127.0.0.1:8188\r\n" + name + b": v\r\n\r\n"
    assert aiohttp.DIALECT.fits(up)
    # Go's net/http has no such rule: its head keeps the X-Forwarded-For
    assert b"X-Forwarded-For: 127.0.0.1\r\n" in sent(go.DIALECT, data)


def test_128_fields_leave_no_room_for_x_forwarded_for():
    fields = b"".join(b"X-%d: %d\r\n" % (i, i) for i in range(MAX_HEADERS - 1))
    data = b"GET / HTTP/1.1\r\nHost: h\r\n" + fields + b"\r\n"
    up = sent(aiohttp.DIALECT, data)
    assert up.count(b"\r\n") - 2 == MAX_HEADERS
    assert b"X-Forwarded-For" not in up and aiohttp.DIALECT.fits(up)


def test_the_host_goes_where_the_clients_was_where_the_front_has_no_room():
    # in front, the long name would be measured with Host's: 4 + 8,188 > 8,190
    name = b"N" * (MAX_FIELD_SIZE - 2)
    data = b"GET / HTTP/1.1\r\n" + name + b": v\r\nX: 1\r\nhost: h\r\n\r\n"
    assert aiohttp.DIALECT.fits(data)
    up = sent(aiohttp.DIALECT, data)
    assert up == (
        b"GET / HTTP/1.1\r\n" + name + b": v\r\nX: 1\r\nhost: 127.0.0.1:8188\r\n"
        b"X-Forwarded-For: 127.0.0.1\r\n\r\n"
    )


def test_a_go_head_near_the_read_limit_goes_without_x_forwarded_for():
    line = b"GET / HTTP/1.1\r\nHost: localhost:11434\r\nX-Pad: "
    pad = b"p" * (go.READ_LIMIT - len(line) - len(b"\r\n\r\n") - 5)
    data = line + pad + b"\r\n\r\n"
    up = sent(go.DIALECT, data)
    assert b"X-Forwarded-For" not in up and len(up) <= go.READ_LIMIT
    short = sent(go.DIALECT, line + b"p\r\n\r\n")
    assert short.endswith(b"X-Pad: p\r\nX-Forwarded-For: 127.0.0.1\r\n\r\n")


def test_a_go_head_of_fields_sent_without_spaces_goes_without_them_where_it_must():
    fields = b"".join(b"X%d:v\r\n" % i for i in range(400))
    line = b"GET / HTTP/1.1\r\nHost: localhost:11434\r\n" + fields + b"X-Pad:"
    data = line + b"p" * (go.READ_LIMIT - len(line) - 4) + b"\r\n\r\n"
    assert len(data) == go.READ_LIMIT
    assert isinstance(go.DIALECT.read_head(data, b"-"), RequestHead)
    up = sent(go.DIALECT, data)
    assert b"\r\nX1:v\r\n" in up and go.DIALECT.fits(up)


def test_go_counts_no_field_lines_so_2000_fields_still_get_x_forwarded_for():
    # Go 1.26 (the runtime's) reads any number of field lines within the read limit;
    # the count of 500 is Go 1.27's
    fields = b"".join(b"X-%d: %d\r\n" % (i, i) for i in range(2_000))
    data = b"GET / HTTP/1.1\r\nHost: h\r\n" + fields + b"\r\n"
    head = go.DIALECT.read_head(data, b"-")
    assert isinstance(head, RequestHead) and len(head.headers) == 2_001
    up = sent(go.DIALECT, data)
    assert up.endswith(b"X-Forwarded-For: 127.0.0.1\r\n\r\n") and go.DIALECT.fits(up)
    assert isinstance(go.DIALECT.read_head(up, b"-"), RequestHead)


NAMES = st.sampled_from([1, 4, 15, 100, 4000, 8000, 8150, 8180, 8186, 8187, 8190, 8191])
VALUES = st.sampled_from([0, 1, 5, 14, 100, 4000, 8000, 8186, 8190, 8191])


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.tuples(NAMES, VALUES), min_size=0, max_size=6),
    st.integers(0, 6),
    st.integers(0, 130),
)
def test_fits_is_what_aiohttps_parser_takes(fields, host_at, filler):
    """`fits` against aiohttp's parser itself (the dialect reads heads with it)."""
    lines = [b"N" * n + b": " + b"v" * v + b"\r\n" for n, v in fields]
    lines.insert(min(host_at, len(lines)), b"Host: h\r\n")  # HTTP/1.1 needs one
    lines += [b"F: f\r\n"] * filler
    data = b"GET / HTTP/1.1\r\n" + b"".join(lines) + b"\r\n"
    taken = isinstance(aiohttp.DIALECT.read_head(data, b"-"), RequestHead)
    assert aiohttp.DIALECT.fits(data) == taken
