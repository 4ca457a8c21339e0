"""Go's net/http server (`ServerDialect.GO`'s): how it reads a request's head and body,
and the answers it writes itself.

The Go runtime serves through gin on a default `http.Server{Handler: nil}` (its
server/routes.go `Serve`;
gin's 405 with `Allow` is the handler's, `r.HandleMethodNotAllowed = true` in
`GenerateRoutes`), so every rule here is net/http's defaults, read from Go's source
(GOROOT/src of Go 1.26.0, the toolchain the runtime's go.mod names and its release builds
use, and the oracle is built with):

* net/http/server.go `(*conn).serve`: a request it cannot read is answered
  `HTTP/1.1 <code> <text>` + `Content-Type: text/plain; charset=utf-8` + `Connection: close`
  and the connection closed; the body is `<code> <text>` (`: <reason>` only for a statusError:
  505 "unsupported protocol version", 400 "missing required Host header", "malformed Host
  header", "invalid header name"); 431 past the read limit; 501 "Unsupported transfer
  encoding"; `Expect` other than 100-continue is a 417 written as a handler's answer.
* server.go `(*conn).readRequest`: read limit `DefaultMaxHeaderBytes` (1 MiB) + 4096 bytes
  of bufio slop, and no count of header lines (Go 1.27's `DefaultMaxHeaderValueCount` of
  500 is not in 1.26); HTTP/1.x of any minor version is served, `PRI * HTTP/2.0` too,
  every other version 505; a Host is required from 1.1 on except for CONNECT. A CONNECT
  is otherwise any request: answered framed, the connection kept (Go 1.27 closes after
  it and sends a successful one unframed).
* request.go `readRequest`, `parseRequestLine` (two single spaces), `validMethod`
  (any token: `get` is a method), `ParseHTTPVersion` (`HTTP/X.Y`, one digit each);
  net/url `parse` for the target; a textproto error (even "message too large") is a 400.
* net/textproto/reader.go `readMIMEHeader`: bare LF ends a line; a line starting with a
  space or tab continues the one before (folded, joined by one space); names are
  canonicalised (`content-length` is `Content-Length`), a name with a space is kept as is
  (and refused later); values lose leading and trailing blanks.
* transfer.go `readTransfer`: `Transfer-Encoding` is ignored below HTTP/1.1, must otherwise
  be exactly `chunked` (any case) or 501; with `chunked`, `Content-Length` is ignored (but
  still parsed); several `Content-Length`s are one if all equal, else 400.
* internal/chunked.go `chunkedReader`: chunk lines end in CRLF, extensions after `;`
  ignored, at most 16 hex digits, a line under 4096 bytes; errors reach the handler
  (the runtime answers them), the server then closes (`body.Close` marks an early close).

Lines, fields and targets are read in go_text.py (net/textproto, net/url), chunked bodies in
go_chunked.py; this module holds the server's own rules and answers.
"""

from __future__ import annotations

import re

from gpugate.proxy.dialects.base import (
    AnswerVersion,
    ContinueRule,
    Framing,
    Refusal,
    RequestHead,
    ServerDefaults,
)
from gpugate.proxy.dialects.go_chunked import GoChunkReader
from gpugate.proxy.dialects.go_text import (
    TOKEN,
    UNREAD,
    Incomplete,
    Lines,
    Malformed,
    canonical_key,
    has_token,
    has_token_list,
    read_fields,
    valid_target,
)

MAX_HEADER_BYTES = 1 << 20
"""server.go `DefaultMaxHeaderBytes`."""
READ_LIMIT = MAX_HEADER_BYTES + 4096
"""server.go `initialReadLimitSize`: the head may take this many bytes off the wire."""

CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
"""server.go `expectContinueReader.Read`: written when the handler first reads the body."""
MAX_POST_HANDLER_READ = 256 << 10
"""server.go `maxPostHandlerReadBytes`."""

_ERROR_HEADERS = b"\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n"
_HOST = frozenset(
    b"0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ!$%&()*+,-.:;=[']_~"
)
"""httpguts `validHostByte`."""
_NOT_HOST = re.compile(b"[^" + re.escape(bytes(sorted(_HOST))) + b"]")
_NOT_TOKEN = re.compile(b"[^" + re.escape(bytes(sorted(TOKEN))) + b"]")

STATUS_TEXT = {
    100: "Continue", 200: "OK", 201: "Created", 204: "No Content", 301: "Moved Permanently",
    304: "Not Modified", 400: "Bad Request", 401: "Unauthorized", 403: "Forbidden",
    404: "Not Found", 405: "Method Not Allowed", 408: "Request Timeout", 409: "Conflict",
    413: "Request Entity Too Large", 417: "Expectation Failed", 429: "Too Many Requests",
    431: "Request Header Fields Too Large", 500: "Internal Server Error",
    501: "Not Implemented", 502: "Bad Gateway", 503: "Service Unavailable",
    504: "Gateway Timeout", 505: "HTTP Version Not Supported", 507: "Insufficient Storage",
}  # fmt: skip
"""status.go `StatusText`, for the statuses a gate answers with."""


def _refusal(code: int, reason: str = "") -> Refusal:
    """server.go `(*conn).serve`'s answer to a request it could not read."""
    text = STATUS_TEXT[code]
    if code == 501:
        line = f"{code} {text}".encode()
        return Refusal(
            b"HTTP/1.1 " + line + _ERROR_HEADERS + b"Unsupported transfer encoding", True
        )
    public = f"{code} {text}: {reason}" if reason else f"{code} {text}"
    data = b"HTTP/1.1 " + public.encode() + _ERROR_HEADERS + public.encode()
    return Refusal(data, True)


BAD_REQUEST = _refusal(400)
TOO_LARGE = _refusal(431)
NOT_IMPLEMENTED = _refusal(501)
UNSUPPORTED_VERSION = _refusal(505, "unsupported protocol version")


class _Bad(Exception):
    """The head is refused with `refusal`."""

    def __init__(self, refusal: Refusal) -> None:
        self.refusal = refusal


def _content_length(values: list[str]) -> int:
    """transfer.go `fixLength` and `parseContentLength`."""
    first = values[0].strip(" \t\r\n")
    if len(values) > 1 and any(v.strip(" \t\r\n") != first for v in values[1:]):
        raise _Bad(BAD_REQUEST)
    if not (first.isascii() and first.isdigit()) or int(first) >= 1 << 63:
        raise _Bad(BAD_REQUEST)
    return int(first)


def _check_trailer(values: list[str]) -> None:
    """transfer.go `fixTrailer` (for a chunked request): no count of the names (Go 1.27's)."""
    for value in values:
        for element in value.split(","):
            element = element.strip(" \t\r\n")
            if element and canonical_key(element.encode("latin-1")) in (
                "Transfer-Encoding",
                "Trailer",
                "Content-Length",
            ):
                raise _Bad(BAD_REQUEST)


def _expectation_failed(version: tuple[int, int], date: bytes) -> Refusal:
    """server.go `sendExpectationFailed`: a 417 written as a handler's answer would be."""
    line = b"HTTP/1.1" if version >= (1, 1) else b"HTTP/1.0"
    data = line + b" 417 Expectation Failed\r\nConnection: close\r\nDate: " + date
    return Refusal(data + b"\r\nContent-Length: 0\r\n\r\n", True)


def _global_options(version: tuple[int, int], date: bytes, close: bool) -> Refusal:
    """server.go `serverHandler.ServeHTTP`: `OPTIONS *` is answered by the server itself
    (`globalOptionsHandler`, which sets Content-Length 0); with a body it is not modelled
    here and goes to the upstream, whose own net/http answers it the same way."""
    line = b"HTTP/1.1 200 OK" if version >= (1, 1) else b"HTTP/1.0 200 OK"
    data = line + b"\r\nContent-Length: 0\r\nDate: " + date + b"\r\n"
    if close and version >= (1, 1):
        data += b"Connection: close\r\n"
    elif not close and version < (1, 1):
        data += b"Connection: keep-alive\r\n"
    return Refusal(data + b"\r\n", close)


_RequestLine = tuple[bytes, bytes, bytes, tuple[int, int]]
_REQUEST_LINES: dict[bytes, _RequestLine | None] = {}
"""Request lines read (None: refused): clients send the same few targets again and again."""
_REQUEST_LINES_MOST = 4096
_REQUEST_LINE_LONGEST = 512
_SPECIAL = frozenset(
    {"Host", "Connection", "Transfer-Encoding", "Content-Length", "Trailer", "Expect", "Upgrade"}
)
"""The fields net/http's reading of a request looks at."""
_NONE: list[str] = []


def _request_line(line: bytes) -> _RequestLine | None:
    """request.go `parseRequestLine`, `ParseHTTPVersion` and `url.ParseRequestURI` on the
    target: (method, target, proto, version), None where the server answers 400."""
    found = _REQUEST_LINES.get(line, UNREAD)
    if found is not UNREAD:
        return found  # type: ignore[return-value]
    method, sp1, rest = line.partition(b" ")
    target, sp2, proto = rest.partition(b" ")
    read: _RequestLine | None = None
    if sp1 and sp2 and method and not _NOT_TOKEN.search(method):
        version = _parse_version(proto)
        if version is not None and valid_target(target, method == b"CONNECT"):
            read = (method, target, proto, version)
    if len(line) <= _REQUEST_LINE_LONGEST:
        if len(_REQUEST_LINES) >= _REQUEST_LINES_MOST:
            _REQUEST_LINES.clear()
        _REQUEST_LINES[bytes(line)] = read
    return read


def _read_head(lines: Lines, date: bytes) -> RequestHead:
    """request.go `readRequest`, then server.go `(*conn).readRequest`'s checks."""
    read = _request_line(lines.line())
    if read is None:
        raise _Bad(BAD_REQUEST)
    method, target, proto, version = read
    fields = read_fields(lines)
    special: dict[str, list[str]] = {}
    spaced = False
    for key, value in fields:
        if " " in key:
            # read_fields keeps a name with a space as sent (the other bytes of a name are
            # a token's): net/http refuses it below
            spaced = True
        elif key in _SPECIAL:
            found = special.get(key)
            if found is None:
                special[key] = [value]
            else:
                found.append(value)
    get = special.get
    hosts = get("Host", _NONE)
    if len(hosts) > 1:
        raise _Bad(BAD_REQUEST)
    connection = get("Connection", _NONE)
    first_connection = connection[0] if connection else ""
    if version == (1, 0):
        # server.go writeHeader: a 1.0 request whose first Connection value has the
        # keep-alive token is kept open (if its answer has a length), even beside close
        close = not has_token(first_connection, "keep-alive")
    else:
        close = any(has_token_list(v, "close") for v in connection)
        close = close or has_token(first_connection, "close")
    codings = get("Transfer-Encoding", _NONE)
    chunked = False
    if codings and version >= (1, 1):
        if len(codings) != 1 or codings[0].lower() != "chunked":
            raise _Bad(NOT_IMPLEMENTED)
        chunked = True
    lengths = get("Content-Length", _NONE)
    length = _content_length(lengths) if lengths else 0
    if chunked and "Trailer" in special:
        _check_trailer(special["Trailer"])
    h2_upgrade = method == b"PRI" and not fields and target == b"*" and proto == b"HTTP/2.0"
    if h2_upgrade:
        close = True
    if version[0] != 1 and not (version == (2, 0) and method == b"PRI" and target == b"*"):
        raise _Bad(UNSUPPORTED_VERSION)
    if version >= (1, 1) and not hosts and not h2_upgrade and method != b"CONNECT":
        raise _Bad(_refusal(400, "missing required Host header"))
    if len(hosts) == 1 and _NOT_HOST.search(hosts[0].encode("latin-1")):
        raise _Bad(_refusal(400, "malformed Host header"))
    if spaced:
        raise _Bad(_refusal(400, "invalid header name"))
    framing = Framing.CHUNKED if chunked else Framing.LENGTH if length else Framing.NONE
    expect = get("Expect", _NONE)
    expect_continue = bool(expect) and has_token(expect[0], "100-continue")
    if expect and expect[0] and not expect_continue:
        raise _Bad(_expectation_failed(version, date))
    upgrade = "Upgrade" in special and any(has_token(v, "upgrade") for v in connection)
    return RequestHead(
        method=method.decode("latin-1"),
        target=target.decode("latin-1"),
        version=version,
        headers=tuple(fields),
        framing=framing,
        length=length if framing is Framing.LENGTH else 0,
        keep_alive=not close,
        expect_continue=expect_continue and version >= (1, 1) and framing is not Framing.NONE,
        upgrade=upgrade,
        size=lines.pos,
    )


def _parse_version(proto: bytes) -> tuple[int, int] | None:
    """request.go `ParseHTTPVersion`."""
    if proto == b"HTTP/1.1":
        return (1, 1)
    if proto == b"HTTP/1.0":
        return (1, 0)
    if len(proto) != 8 or not proto.startswith(b"HTTP/") or proto[6] != 0x2E:
        return None
    major, minor = proto[5:6], proto[7:8]
    if not (major.isdigit() and minor.isdigit()):
        return None
    return (int(major), int(minor))


class GoDialect(ServerDefaults):
    """Go's net/http server, as `HttpDialect`."""

    name = "go"
    answers = AnswerVersion.HTTP10_AS_ASKED
    chunks_any_version = False
    keeps_as_head_said = False
    answers_after_client_end = False
    continue_rule = ContinueRule.FIRST_READ
    """server.go: `readRequest`'s caller wraps the body of an HTTP/1.1+ request expecting
    100-continue with a non-zero ContentLength in an `expectContinueReader`, whose first
    `Read` writes `100 Continue` (whatever is buffered already), unless the handler's
    answer has begun writing (`response.write` calls `disableWriteContinue`)."""

    def read_head(self, buffer: bytes, date: bytes) -> RequestHead | Refusal | None:
        """The next request's head, None while incomplete, or net/http's own answer."""
        lines = Lines(buffer)
        try:
            head = _read_head(lines, date)
        except Incomplete:
            return TOO_LARGE if len(buffer) > READ_LIMIT else None
        except (_Bad, Malformed) as bad:
            # any error once the reader is past the limit is a 431 (`hitReadLimit`)
            if lines.pos > READ_LIMIT:
                return TOO_LARGE
            return bad.refusal if isinstance(bad, _Bad) else BAD_REQUEST
        return TOO_LARGE if head.size > READ_LIMIT else head

    def own_answer(self, head: RequestHead, date: bytes) -> Refusal | None:
        """An answer net/http writes itself to a head it read well (`OPTIONS *` without a
        body); the connection then goes on unless the Refusal says close."""
        if head.method == "OPTIONS" and head.target == "*" and head.framing is Framing.NONE:
            return _global_options(head.version, date, not head.keep_alive)
        return None

    def closes_after_body(self, head: RequestHead, read: int, error: str) -> bool:
        """Whether net/http closes the connection after answering a request whose body
        ended in `error` after `read` bytes: a Content-Length body cut short by the
        client's close counts as read to its end (transfer.go `body.readLocked` sets
        sawEOF) unless 256 KiB or more were never sent (server.go `writeHeader`,
        `maxPostHandlerReadBytes`), or it expected 100-continue: Go 1.26's `writeHeader`
        closes unless its `expectContinueReader` returned io.EOF, and a cut body returns
        io.ErrUnexpectedEOF (Go 1.27 asks the body, which did see its end); any other body
        error is an early close."""
        if not error:
            return not head.keep_alive
        short = head.framing is Framing.LENGTH and head.length - read < MAX_POST_HANDLER_READ
        if short and not head.expect_continue:
            return not head.keep_alive
        return True

    peek_before_next = 4
    """server.go `conn.serve`: after an answer, the server waits for 4 bytes
    (`c.bufr.Peek(4)`) before it reads the next request, and closes silently if the
    connection ends first: a shorter rest (a stray CRLF) is neither read nor refused."""

    def skip_before_head(self, buffer: bytes, last_method: str) -> int:
        """server.go `readRequest`: after a POST, up to 4 leading CR or LF bytes are dropped."""
        if last_method != "POST":
            return 0
        n = 0
        while n < min(4, len(buffer)) and buffer[n] in (0x0D, 0x0A):
            n += 1
        return n

    def chunks(self) -> GoChunkReader:
        """A reader for one chunked body."""
        return GoChunkReader()

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
        """server.go `(*chunkWriter).writeHeader`: the handler's fields sorted by name
        (header.go `sortedKeyValues`), then Date, Content-Length, Connection,
        Transfer-Encoding (`extraHeader.Write`); no Server field. An HTTP/1.0 answer with
        `length` None is delimited by the close; a HEAD's with no body written has no
        Content-Length. A CONNECT's is framed as any (Go 1.26 has no `isSuccessfulCONNECT`)."""
        is11 = version >= (1, 1)
        text = STATUS_TEXT.get(status)
        # server.go writeStatusLine: a status without a text is "%03d status code %d"
        reason = (
            b"%d %s" % (status, text.encode())
            if text
            else b"%03d status code %d" % (status, status)
        )
        out = [b"HTTP/1.1 " if is11 else b"HTTP/1.0 ", reason + b"\r\n"]
        canon = sorted(
            ((canonical_key(k.encode("latin-1")) or k, v) for k, v in headers), key=lambda kv: kv[0]
        )
        # transfer.go suppressedHeaders: a 304 loses its Content-Type, every bodiless
        # status its framing fields
        suppressed = (
            {"Content-Length", "Transfer-Encoding"}
            if status < 200 or status in (204, 304)
            else set()
        )
        if status == 304:
            suppressed.add("Content-Type")
        for key, value in canon:
            if key in suppressed:
                continue
            value = value.replace("\r", " ").replace("\n", " ").strip(" \t\r\n")
            out.append(f"{key}: {value}\r\n".encode("latin-1"))
        out.append(b"Date: " + date + b"\r\n")
        bodiless = status < 200 or status in (204, 304)
        head = method == "HEAD"
        sized = length is not None and not bodiless and not (head and length == 0)
        if sized:
            out.append(b"Content-Length: %d\r\n" % length)
        if close and is11:
            out.append(b"Connection: close\r\n")
        elif not close and not is11 and (sized or bodiless or head):
            out.append(b"Connection: keep-alive\r\n")
        if length is None and is11 and not bodiless and not head:
            out.append(b"Transfer-Encoding: chunked\r\n")
        out.append(b"\r\n")
        return b"".join(out)

    def fits(self, head: bytes) -> bool:
        """Whether net/http reads this request head (as the gate sends one upstream: a
        request line and CRLF-ended fields, none folded): it must come within
        `READ_LIMIT` bytes (server.go `readRequest`: the connection's reader stops at
        `initialReadLimitSize`, and a head cut there is 431); Go 1.26 counts no lines."""
        return len(head) <= READ_LIMIT

    def on_eof_mid_head(self, buffer: bytes, date: bytes, *, first: bool = True) -> Refusal | None:
        """The client half-closed mid-head: nothing read, or (on a kept connection) fewer
        than the 4 bytes `serve` peeks for, closes silently; else the partial line is read
        as a line and the head ends in an unexpected EOF: 400 (or 431 past the limit)."""
        if not buffer or (not first and len(buffer) < 4):
            return None
        return TOO_LARGE if len(buffer) > READ_LIMIT else BAD_REQUEST


DIALECT = GoDialect()
