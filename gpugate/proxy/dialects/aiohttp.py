"""aiohttp's server as ComfyUI runs it: `web.Application(client_max_size=..., middlewares=...)`
under `web.AppRunner(app, access_log=None)` and `web.TCPSite` (ComfyUI server.py
`PromptServer.__init__`, `start_multi_address`), so every `RequestHandler` setting is aiohttp's
default (aiohttp 3.14 web_protocol.py `RequestHandler.__init__`): request line and each header
line at most 8,190 bytes, at most 128 header fields, keep-alive 3,630 s, lingering 10 s.

The head is read by aiohttp's own parser (the C `HttpRequestParser` over llhttp, as
`RequestHandler` builds it), so every acceptance and refusal is aiohttp's by construction:
CRLF only (a bare LF is refused), no folded lines, HTTP/1.2 refused, HTTP/2.0 and HTTP/0.9
served with the connection closed after, `Host` required from 1.1 on, `Transfer-Encoding`
with `Content-Length` refused. What it refuses is answered as `RequestHandler.handle_error`
answers (web_protocol.py `data_received` turns the parser's `HttpProcessingError` into a 400
`_ErrInfo`; the request it answers is `ERROR`, an HTTP/1.0 message): `HTTP/1.0 400 Bad
Request`, `Content-Type: text/plain; charset=utf-8`, Content-Length, Date, Server, the
parser's message as the body, and the connection closed (`force_close`).

One read is one `feed_data`: aiohttp raises on the first bad byte of what it was handed and
drops the requests parsed before it in the same read (web_protocol.py `data_received`), so a
complete request followed in the same read by junk is refused whole, not served. `read_head`
feeds the buffer for that reason, up to what one read can hold (256 KiB).

Answers: aiohttp writes the handler's headers first, then Content-Length (or
`Transfer-Encoding: chunked`), Date, Server and, only where it changes the default,
Connection (`close` on HTTP/1.1, `keep-alive` on a kept HTTP/1.0) — web_response.py
`StreamResponse._prepare_headers`. A handler that raises anything but an `HTTPException` is
answered by `handle_error`, which calls `force_close()`: ComfyUI's 500s therefore carry
`Connection: close` on HTTP/1.1 and the connection is closed. The status line carries the
request's own version (`_write_headers`), so `answer_head` takes it.
"""

from __future__ import annotations

import sys
from http import HTTPStatus

import attrs
from aiohttp import __version__ as aiohttp_version
from aiohttp._http_parser import HttpRequestParser
from aiohttp.http_exceptions import HttpProcessingError

from gpugate.proxy.dialects.base import (
    AnswerVersion,
    Chunks,
    ContinueRule,
    Framing,
    Refusal,
    RequestHead,
    ServerDefaults,
)

MAX_LINE_SIZE = 8190
MAX_FIELD_SIZE = 8190
MAX_HEADERS = 128
READ_BUFSIZE = 2**16
"""aiohttp's `DEFAULT_CHUNK_SIZE`, the `limit` `RequestHandler` hands its parser."""
SERVER = f"Python/{sys.version_info[0]}.{sys.version_info[1]} aiohttp/{aiohttp_version}"
"""aiohttp's `SERVER_SOFTWARE` (http.py) for this interpreter; the runtime's own, learned
from its answers, is passed in `headers` where known."""
END = b"\r\n\r\n"
READ_SIZE = 256 * 1024
"""asyncio's `_SelectorSocketTransport.max_size`: the most one `data_received` holds."""
CHUNKED_PRELUDE = b"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n"


class _Sink:
    """The protocol aiohttp's parser calls for flow control; nothing to pause here."""

    def pause_reading(self, *args: object, **kwargs: object) -> None:
        pass

    def resume_reading(self, resume_parser: bool = True) -> None:
        pass


class _NoLoop:
    """Stands for the event loop a payload would wait on: nothing here waits, and aiohttp
    asks asyncio for the running loop when handed None."""


NO_LOOP = _NoLoop()


def _parser() -> HttpRequestParser:
    return HttpRequestParser(
        _Sink(),
        NO_LOOP,
        READ_BUFSIZE,
        max_line_size=MAX_LINE_SIZE,
        max_field_size=MAX_FIELD_SIZE,
        max_headers=MAX_HEADERS,
    )


def error_answer(status: int, text: str, date: bytes, server: str = SERVER) -> bytes:
    """What `handle_error` writes for the `ERROR` request: HTTP/1.0, text/plain, no
    Connection header (1.0 closing is the default)."""
    body = text.encode("utf-8")
    head = (
        f"HTTP/1.0 {status} {HTTPStatus(status).phrase}\r\n"
        "Content-Type: text/plain; charset=utf-8\r\n"
        f"Content-Length: {len(body)}\r\n"
    ).encode("latin-1")
    return head + b"Date: " + date + b"\r\nServer: " + server.encode("latin-1") + END + body


def _refusal(exc: HttpProcessingError, date: bytes) -> Refusal:
    return Refusal(error_answer(exc.code, exc.message, date), close=True)


@attrs.define(slots=True)
class AiohttpChunkReader:
    """A chunked body decoded by aiohttp's parser, fed exactly the body's bytes.

    The body's end is found by a scan of the chunk framing (size line, data, CRLF; the
    trailer up to its blank line); the bytes up to there go to aiohttp's parser, which
    decodes them and refuses what llhttp refuses. Bytes past the end are left unused.
    """

    parser: HttpRequestParser = attrs.field(factory=_parser)
    payload: object = None
    pending: bytes = b""
    state: str = "size"
    remaining: int = 0
    refused: Refusal | None = None

    def __attrs_post_init__(self) -> None:
        messages, _, _ = self.parser.feed_data(CHUNKED_PRELUDE)
        self.payload = messages[0][1]

    def _scan(self, data: bytes) -> tuple[int, bool]:
        """How many bytes of `data` belong to the body, and whether it ended there."""
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
                return len(data), False
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
                    # Malformed: hand the line to the parser, which refuses it.
                    return pos, False
                if size == 0:
                    self.state = "trailer"
                else:
                    self.state, self.remaining = "data", size
            elif line in (b"", b"\r"):
                return pos, True
        return len(data), False

    def feed(self, data: bytes, date: bytes) -> Chunks:
        """Decode `data`; the bytes past the last chunk's trailer are left unused."""
        if self.refused is not None:
            return Chunks(b"", 0, False, self.refused)
        used, done = self._scan(data)
        try:
            self.parser.feed_data(data[:used])
        except HttpProcessingError as exc:
            self.refused = _refusal(exc, date)
            return Chunks(b"", used, False, self.refused)
        payload = self.payload
        decoded = b"".join(payload._buffer)  # type: ignore[attr-defined]
        payload._buffer.clear()  # type: ignore[attr-defined]
        payload._size = 0  # type: ignore[attr-defined]
        return Chunks(decoded, used, done or payload.is_eof())  # type: ignore[attr-defined]


@attrs.frozen(slots=True)
class AiohttpDialect(ServerDefaults):
    """aiohttp's server with ComfyUI's settings (module docstring: the rules and sources)."""

    name: str = "aiohttp"
    answers = AnswerVersion.AS_ASKED
    chunks_any_version = False
    keeps_as_head_said = False
    answers_after_client_end = False
    continue_rule = ContinueRule.DISPATCH
    """web_app.py `_handle`: once routed, a request with an `Expect` runs the route's
    `expect_handler` before any middleware or handler; `_default_expect_handler` writes
    `100 Continue` to an HTTP/1.1 `100-continue` at once, with or without a body, and
    whether or not its bytes came with the head."""

    def read_head(self, buffer: bytes, date: bytes) -> RequestHead | Refusal | None:
        """The first request's head in `buffer` as aiohttp's parser reads it (the whole
        buffer is parsed: a later request in it that aiohttp refuses refuses them all)."""
        end = buffer.find(END)
        # What one read can hand aiohttp (asyncio's transport reads at most READ_SIZE):
        # enough to refuse a request with junk behind it as aiohttp does, and a bound on
        # what a large body costs to parse again.
        fed = buffer if end < 0 else buffer[: max(READ_SIZE, end + len(END))]
        try:
            messages, _, _ = _parser().feed_data(fed)
        except HttpProcessingError as exc:
            return _refusal(exc, date)
        if not messages:
            return None
        message = messages[0][0]
        length = 0
        framing = Framing.NONE
        if message.chunked:
            framing = Framing.CHUNKED
        else:
            for name, value in message.headers.items():
                if name.lower() == "content-length":
                    length = int(value)
            if length:
                framing = Framing.LENGTH
        expect = message.headers.get("Expect", "")
        return RequestHead(
            method=message.method,
            target=message.path,
            version=(message.version.major, message.version.minor),
            headers=tuple(
                (name.decode("latin-1"), value.decode("latin-1"))
                for name, value in message.raw_headers
            ),
            framing=framing,
            length=length,
            keep_alive=not message.should_close,
            expect_continue=message.version == (1, 1) and expect.lower() == "100-continue",
            upgrade=message.upgrade,
            size=end + len(END),
        )

    def chunks(self) -> AiohttpChunkReader:
        """A reader for one chunked body (aiohttp's parser under a fixed prelude)."""
        return AiohttpChunkReader()

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
        """An answer's head as aiohttp writes a handler's: `headers` first (a `Server` among
        them — the runtime's own, learned from its answers — replaces aiohttp's, in
        aiohttp's place), then Content-Length or Transfer-Encoding, Date, Server, and
        Connection where it differs from the version's default. `version` is the request's:
        aiohttp answers in it. `close` True for what aiohttp's `handle_error` would answer
        (a handler's unexpected exception: ComfyUI's 500s)."""
        server = SERVER
        lines = [f"HTTP/{version[0]}.{version[1]} {status} {_phrase(status)}"]
        for name, value in headers:
            if name.lower() == "server":
                server = value
            else:
                lines.append(f"{name}: {value}")
        if length is None:
            lines.append("Transfer-Encoding: chunked")
        elif not (status < 200 or status in (204, 304)):
            lines.append(f"Content-Length: {length}")
        lines.append("Date: " + date.decode("latin-1"))
        lines.append(f"Server: {server}")
        if close and version == (1, 1):
            lines.append("Connection: close")
        elif not close and version == (1, 0):
            lines.append("Connection: keep-alive")
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")

    def on_eof_mid_head(self, buffer: bytes, date: bytes, *, first: bool = True) -> Refusal | None:
        """aiohttp closes without a word: a half-close ends the transport
        (`RequestHandler` has no `eof_received`, so asyncio closes it)."""
        return None

    def fits(self, head: bytes) -> bool:
        """Whether aiohttp's parser with ComfyUI's limits takes this request head (a
        request line and CRLF-ended fields, as the gate sends one upstream) when it
        arrives in one read (_http_parser.pyx): at most `MAX_HEADERS` fields
        (`_process_header`); each field's name within `MAX_FIELD_SIZE` counted with the
        name of the field before it, which the parser still holds when it measures the
        next name (`cb_on_header_field` measures `_raw_name` before `_on_header_field`
        has processed the previous field); a value within `MAX_FIELD_SIZE` counted with
        its name for the first field only (`cb_on_header_value` adds
        `_header_name_size`, which processing the previous field has reset to 0 for
        every later one). The request-target is the client's, already within
        `MAX_LINE_SIZE`."""
        lines = head.count(b"\r\n") - 2  # less the request line and the blank line
        if len(head) <= MAX_FIELD_SIZE and lines <= MAX_HEADERS:
            return True  # no field can be longer than the head
        if lines > MAX_HEADERS:
            return False
        previous = -1
        for line in head.split(b"\r\n")[1:-2]:
            name, _, value = line.partition(b":")
            value = value.lstrip(b" \t")
            if previous < 0:
                if len(name) + len(value) > MAX_FIELD_SIZE:
                    return False
            elif previous + len(name) > MAX_FIELD_SIZE or len(value) > MAX_FIELD_SIZE:
                return False
            previous = len(name)
        return True

    def expectation_failed(self, head: RequestHead, date: bytes) -> bytes | None:
        """The 417 aiohttp's router answers (web_urldispatcher.py
        `_default_expect_handler`) to an HTTP/1.1 `Expect` other than `100-continue`,
        before the handler; the connection stays open and the body is read and dropped."""
        if head.version != (1, 1):
            return None
        expect = next((v for n, v in head.headers if n.lower() == "expect"), None)
        if expect is None or expect.lower() == "100-continue":
            return None
        body = f"Unknown Expect: {expect}".encode()
        content = [("Content-Type", "text/plain; charset=utf-8")]
        return self.answer_head(417, content, date, length=len(body), close=False) + body


def _phrase(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return ""


DIALECT = AiohttpDialect()
