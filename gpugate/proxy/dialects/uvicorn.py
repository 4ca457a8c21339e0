"""uvicorn's HTTP/1 server as vLLM runs it: `uvicorn.Config(app, **uvicorn_kwargs)` with
`timeout_keep_alive` 5 s (vllm/envs.py `VLLM_HTTP_TIMEOUT_KEEP_ALIVE`), the access log, the
h11 limits and TLS options, and every other setting uvicorn's default (vllm/entrypoints/
launcher.py `serve_http`, openai/api_server.py `run_server_worker`): `http="auto"`, which is
the httptools protocol wherever httptools is installed (uvicorn/protocols/http/auto.py; vLLM
requires `fastapi[standard]`, hence `uvicorn[standard]`), `server_header` and `date_header`
on. The h11 limits vLLM sets (`h11_max_incomplete_event_size`, `h11_max_header_count`) are
read only by the h11 protocol: under httptools no limit of uvicorn's bounds a head.

The head is read by httptools' own parser (llhttp, as uvicorn's `HttpToolsProtocol.__init__`
builds it: `set_dangerous_leniencies(lenient_data_after_close=True)`, every other leniency
off), with uvicorn's callbacks (httptools_impl.py `on_url`, `on_header`,
`on_headers_complete`), so every acceptance and refusal is llhttp's and uvicorn's by
construction: CRLF only, no folded lines, HTTP/1.0, 1.1, 2.0 and 0.9 (also a request line
without a version) served, every other version refused, methods only as llhttp knows them
(`get` refused), no Host required, `Transfer-Encoding` with `Content-Length` refused, two
`Content-Length`s refused, a `Transfer-Encoding` whose last coding is not `chunked` refused.

What llhttp refuses is answered as httptools_impl.py `send_400_response` writes it, and the
connection closed: `HTTP/1.1 400 Bad Request`, uvicorn's default headers (`date`, `server:
uvicorn`), `content-type: text/plain; charset=utf-8`, `content-length`, `connection: close`,
body `Invalid HTTP request received.`. A target httptools' `parse_url` refuses (an
authority, a byte past ASCII) raises `HttpParserInvalidURLError`, an `HttpParserError`,
from `on_headers_complete`: the same 400. Any other exception in a callback would escape
`data_received`, and the event loop close the connection without a word.

One read is one `feed_data` (httptools_impl.py `data_received`): the 400 is written as soon
as a bad byte is read and the connection closed, so the requests parsed before it in the
same read are never answered (their tasks find the transport closed). `read_head` feeds the
buffer for that reason, up to what one read can hold (256 KiB).

uvicorn keeps a connection open after an answer when the request is not HTTP/1.0 and
llhttp's `should_keep_alive` says so (`RequestResponseCycle(keep_alive=http_version != "1.0"
and ...)`): an HTTP/1.0 request is answered `connection: close` even with `Connection:
keep-alive`; an HTTP/2.0 or 0.9 one is kept only with `Connection: keep-alive`. Every answer
is `HTTP/1.1` whatever the request's version (`STATUS_LINE`). `Expect: 100-continue` (any
version, the value compared after uvicorn's trailing-blank strip) gets `HTTP/1.1 100
Continue` when the app first calls `receive()` (`RequestResponseCycle.receive`); any other
`Expect` is ignored (no 417). Request bodies are never decoded: Starlette reads
`http.request` bodies as sent, whatever their `Content-Encoding`.

Not modelled: an `Upgrade` uvicorn does not take (anything but a websocket, and `CONNECT`,
which llhttp reads as an upgrade) is served, then llhttp stays paused and uvicorn reads
nothing more on that connection (`HttpParserUpgrade` on every later read): the listener
closes it after the answer instead. uvicorn bounds no head; the listener refuses one past
`MAX_HEAD` bytes with the 400 above, so that no client holds unbounded memory.
"""

from __future__ import annotations

from http import HTTPStatus

import attrs
import httptools

from gpugate.proxy.dialects.base import (
    AnswerVersion,
    Chunks,
    ContinueRule,
    Framing,
    Refusal,
    RequestHead,
    ServerDefaults,
)

SERVER = b"uvicorn"
"""config.py `Config.load`: `encoded_headers` starts with `(b"server", b"uvicorn")`."""
INVALID = b"Invalid HTTP request received."
"""httptools_impl.py `data_received`: the body of every 400 uvicorn writes itself."""
READ_SIZE = 256 * 1024
"""uvloop's read buffer (`UV_STREAM_RECV_BUF_SIZE`, 256 KiB): the most one `data_received`
holds, as asyncio's `max_size`."""
MAX_HEAD = 1 << 20
"""The listener's own bound on one head (uvicorn under httptools has none)."""
CHUNKED_PRELUDE = b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"


def _default_headers(date: bytes) -> bytes:
    """server.py `Server.on_tick`: `default_headers` is `date` then `server`."""
    return b"date: " + date + b"\r\nserver: " + SERVER + b"\r\n"


def bad_request(date: bytes) -> Refusal:
    """httptools_impl.py `send_400_response`, then `transport.close()`."""
    data = (
        b"HTTP/1.1 400 Bad Request\r\n"
        + _default_headers(date)
        + b"content-type: text/plain; charset=utf-8\r\n"
        + b"content-length: %d\r\n" % len(INVALID)
        + b"connection: close\r\n\r\n"
        + INVALID
    )
    return Refusal(data, close=True)


SILENT_CLOSE = Refusal(b"", close=True)
"""An exception that escapes `data_received`: the loop closes the connection, unanswered."""


@attrs.frozen(slots=True)
class _Read:
    """The first request's head as uvicorn's callbacks leave it."""

    method: str
    version: str
    url: bytes
    headers: list[tuple[bytes, bytes]]
    keep_alive: bool
    upgrade: bool
    expect_continue: bool


class _Head:
    """uvicorn's parser callbacks (httptools_impl.py), keeping the first request's head."""

    def __init__(self, parser: httptools.HttpRequestParser | None = None) -> None:
        self.parser = parser
        self.url = b""
        self.headers: list[tuple[bytes, bytes]] = []
        self.expect_continue = False
        self.first: _Read | None = None

    def on_message_begin(self) -> None:
        self.url = b""
        self.headers = []
        self.expect_continue = False

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        # httptools_impl.py on_header: names lowercased, trailing blanks stripped
        name = name.lower()
        value = value.rstrip(b" \t")
        if name == b"expect" and value.lower() == b"100-continue":
            self.expect_continue = True
        self.headers.append((name, value))

    def on_headers_complete(self) -> None:
        parser = self.parser
        assert parser is not None
        version = parser.get_http_version()
        method = parser.get_method().decode("ascii")
        upgrade = parser.should_upgrade() and _websocket(self.headers)
        if not upgrade:
            # httptools_impl.py on_headers_complete: the target must parse and its path be
            # ASCII, or the exception leaves `feed_data` (an HttpParserError is a 400).
            httptools.parse_url(self.url).path.decode("ascii")
        if self.first is None:
            keep = version != "1.0" and parser.should_keep_alive()
            if parser.should_upgrade() and not upgrade:
                keep = False  # llhttp stays paused: uvicorn reads no more (module docstring)
            self.first = _Read(
                method, version, self.url, self.headers, keep, upgrade, self.expect_continue
            )


def _websocket(headers: list[tuple[bytes, bytes]]) -> bool:
    """httptools_impl.py `_get_upgrade` / `_should_upgrade` (a websocket library installed,
    as `uvicorn[standard]` installs one): the last `connection` field has the `upgrade`
    token and the last `upgrade` field is `websocket`."""
    connection: list[bytes] = []
    upgrade = None
    for name, value in headers:
        if name == b"connection":
            connection = [token.lower().strip() for token in value.split(b",")]
        if name == b"upgrade":
            upgrade = value.lower()
    return b"upgrade" in connection and upgrade == b"websocket"


def _parser(sink: _Head) -> httptools.HttpRequestParser:
    parser = httptools.HttpRequestParser(sink)
    # httptools_impl.py HttpToolsProtocol.__init__
    parser.set_dangerous_leniencies(lenient_data_after_close=True)
    sink.parser = parser
    return parser


def _head_size(buffer: bytes) -> int:
    """Where the first head ends: llhttp skips CR and LF before a request line, and a head
    ends at its blank line (a line with no version, HTTP/0.9, is followed by fields too)."""
    start = 0
    while start < len(buffer) and buffer[start] in (0x0D, 0x0A):
        start += 1
    return buffer.find(b"\r\n\r\n", start) + 4


@attrs.define(slots=True)
class UvicornChunkReader:
    """A chunked body decoded by httptools' parser (llhttp), fed exactly the body's bytes.

    The body's end is found by a scan of the chunk framing (size line, data, CRLF; the
    trailer up to its blank line); the bytes up to there go to the parser, which decodes
    them and refuses what llhttp refuses (uvicorn's 400, the connection closed). Bytes past
    the end are left unused.
    """

    sink: _Head = attrs.field(factory=_Head)
    parser: httptools.HttpRequestParser | None = None
    body: bytearray = attrs.field(factory=bytearray)
    done: bool = False
    state: str = "size"
    remaining: int = 0
    refused: Refusal | None = None

    def __attrs_post_init__(self) -> None:
        # httptools looks its callbacks up once, when the parser is made
        self.sink.on_body = self._on_body  # type: ignore[attr-defined]
        self.sink.on_message_complete = self._on_complete  # type: ignore[attr-defined]
        self.parser = _parser(self.sink)
        self.parser.feed_data(CHUNKED_PRELUDE)

    def _on_body(self, data: bytes) -> None:
        self.body += data

    def _on_complete(self) -> None:
        self.done = True

    def _scan(self, data: bytes) -> int:
        """How many bytes of `data` belong to the body (all of them while it goes on)."""
        pos = 0
        while pos < len(data):
            if self.state == "data":
                take = min(self.remaining, len(data) - pos)
                pos += take
                self.remaining -= take
                if self.remaining == 0:
                    self.state = "crlf"
                continue
            end = data.find(b"\n", pos)
            if end < 0:
                return len(data)
            line = data[pos:end]
            pos = end + 1
            if self.state == "crlf":
                self.state = "size"
            elif self.state == "size":
                digits = line.split(b";", 1)[0].strip()
                try:
                    size = int(digits, 16) if digits else -1
                except ValueError:
                    size = -1
                if size < 0:
                    return pos  # malformed: the parser refuses the line
                if size == 0:
                    self.state = "trailer"
                else:
                    self.state, self.remaining = "data", size
            elif line in (b"", b"\r"):
                return pos
        return len(data)

    def feed(self, data: bytes, date: bytes) -> Chunks:
        """Decode `data`; the bytes past the last chunk's trailer are left unused."""
        if self.refused is not None:
            return Chunks(b"", 0, False, self.refused)
        used = self._scan(data)
        assert self.parser is not None
        try:
            self.parser.feed_data(data[:used])
        except httptools.HttpParserError:
            self.refused = bad_request(date)
            return Chunks(b"", used, False, self.refused)
        decoded = bytes(self.body)
        self.body.clear()
        return Chunks(decoded, used, self.done)


@attrs.frozen(slots=True)
class UvicornDialect(ServerDefaults):
    """uvicorn's httptools protocol with vLLM's settings (module docstring)."""

    name: str = "uvicorn"
    answers = AnswerVersion.HTTP11
    chunks_any_version = True
    keeps_as_head_said = True
    answers_after_client_end = False
    continue_rule = ContinueRule.FIRST_READ
    """`100 Continue` goes when the app first reads the body, even if the body already came
    (httptools_impl.py `RequestResponseCycle.receive` checks only that no answer started)."""

    def read_head(self, buffer: bytes, date: bytes) -> RequestHead | Refusal | None:
        """The first request's head in `buffer` as uvicorn reads it (the whole buffer, up to
        one read, is parsed: a later request in it that llhttp refuses refuses them all)."""
        end = buffer.find(b"\r\n\r\n")
        fed = buffer if end < 0 else buffer[: max(READ_SIZE, end + 4)]
        sink = _Head()
        try:
            _parser(sink).feed_data(fed)
        except httptools.HttpParserUpgrade:
            pass  # llhttp paused after an upgrade's head: the head itself was read
        except httptools.HttpParserError:
            return bad_request(date)
        except Exception:
            return SILENT_CLOSE
        if sink.first is None:
            return bad_request(date) if len(buffer) > MAX_HEAD else None
        first = sink.first
        raw = first.headers
        headers = tuple((n.decode("latin-1"), v.decode("latin-1")) for n, v in raw)
        framing, length = Framing.NONE, 0
        if any(n == b"transfer-encoding" for n, _ in raw):
            framing = Framing.CHUNKED  # llhttp refuses any other last coding
        else:
            lengths = [v for n, v in raw if n == b"content-length"]
            length = int(lengths[0].strip()) if lengths else 0
            framing = Framing.LENGTH if length else Framing.NONE
        major, _, minor = first.version.partition(".")
        return RequestHead(
            method=first.method,
            target=first.url.decode("latin-1"),
            version=(int(major), int(minor)),
            headers=headers,
            framing=framing,
            length=length,
            keep_alive=first.keep_alive,
            expect_continue=first.expect_continue,
            upgrade=first.upgrade,
            size=_head_size(buffer),
        )

    def chunks(self) -> UvicornChunkReader:
        """A reader for one chunked body (httptools' parser under a fixed prelude)."""
        return UvicornChunkReader()

    def answer_head(
        self,
        status: int,
        headers: list[tuple[str, str]],
        date: bytes,
        *,
        length: int | None,
        close: bool,
        version: tuple[int, int] = (1, 1),
        method: str = "",
    ) -> bytes:
        """An answer's head as uvicorn writes a Starlette response's: `HTTP/1.1` whatever
        the request's version, `date` and `server` first (a `server` among `headers`
        replaces uvicorn's: `encoded_headers`), then the response's own fields lowercased —
        Starlette's `Response.init_headers` order: the given ones, `content-length`,
        `content-type` — then `connection: close` when the connection ends, and
        `transfer-encoding: chunked` when no length is known (httptools_impl.py `send`)."""
        phrase = _phrase(status)
        own = [(n.lower(), v) for n, v in headers]
        server = next((v for n, v in own if n == "server"), None)
        lines = [f"HTTP/1.1 {status} {phrase}", "date: " + date.decode("latin-1")]
        lines.append(f"server: {server if server is not None else SERVER.decode()}")
        own = [(n, v) for n, v in own if n != "server"]
        names = {n for n, _ in own}
        if "content-length" in names:
            # a raw ASGI response's fields, as given (uvicorn's own 500: `send_500_response`)
            lines += [f"{n}: {v}" for n, v in own]
        else:
            lines += [f"{n}: {v}" for n, v in own if n != "content-type"]
            if length is not None and not (status < 200 or status in (204, 304)):
                lines.append(f"content-length: {length}")
            lines += [f"{n}: {v}" for n, v in own if n == "content-type"]
        said = any(n == "connection" and "close" in _tokens(v) for n, v in own)
        if close and not said:
            lines.append("connection: close")
        if length is None and status not in (204, 304):
            lines.append("transfer-encoding: chunked")
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")

    def on_eof_mid_head(self, buffer: bytes, date: bytes, *, first: bool = True) -> Refusal | None:
        """uvicorn closes without a word (`eof_received` returns None: the loop closes)."""
        return None


def _tokens(value: str) -> list[str]:
    return [token.strip().lower() for token in value.split(",")]


def _phrase(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return ""


DIALECT = UvicornDialect()
