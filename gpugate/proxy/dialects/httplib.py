"""cpp-httplib as whisper-server and llama-server run it.

The two runtimes vendor different cpp-httplib releases: llama-server (llama.cpp as
llama-cpp-python 0.3.36 vendors it, vendor/cpp-httplib/httplib.cpp) runs 0.58.0,
whisper-server (whisper.cpp as pywhispercpp 1.5.1 vendors it, examples/server/httplib.h) runs
0.20.0. `DIALECT` is llama-server's, `WHISPER` whisper-server's; the rules they share:

* A line ends only at CRLF (`stream_line_reader::getline`; a bare LF is a byte of the line).
  The request line is split at spaces, empty parts dropped, and must have exactly three
  parts, a method of GET HEAD POST PUT DELETE CONNECT OPTIONS TRACE PATCH PRI and the version
  `HTTP/1.1` or `HTTP/1.0` exactly (`Server::parse_request_line`); anything else is 400.
* A header line is at most 8,192 bytes with its CRLF (CPPHTTPLIB_HEADER_MAX_LENGTH); its
  name a token, its value visible characters with inner spaces, no folding (`read_headers`,
  `parse_header`, `fields::is_field_value`); else 400.
* Every answer is `HTTP/1.1`; the server adds `Keep-Alive: timeout=5, max=100` (or
  `Connection: close`), Content-Type `text/plain` for a body without one, and
  `Content-Length: 0` for no body (`Server::write_response_core`).
* The connection ends after 100 requests (CPPHTTPLIB_KEEPALIVE_MAX_COUNT: the 100th answer
  carries `Connection: close`), after 5 s idle (CPPHTTPLIB_KEEPALIVE_TIMEOUT_SECOND), after
  `Connection: close`, and after an HTTP/1.0 request without keep-alive — whose answer still
  says `Keep-Alive` (`process_server_socket_core`, `process_request`).
* Each request gets a fresh `SocketStream` with its own 4 KiB read buffer, so bytes read past
  a request's end in the same read are dropped, not read as the next request: pipelined
  requests after the first are lost. A refusal that keeps the connection (`close=False`)
  therefore means: drop what was buffered and read the next request from new bytes.

llama-server (0.58.0) further: a request line longer than 32,768 bytes
(CPPHTTPLIB_MAX_LINE_LENGTH) ends the connection without a word; more than 100 header
fields (CPPHTTPLIB_HEADER_MAX_COUNT) or two different Content-Lengths are 400; a non-zero
Content-Length beside a Transfer-Encoding, or a Transfer-Encoding not ending in chunked, is 400
and closed; a target past CPPHTTPLIB_REQUEST_URI_MAX_LENGTH is 414 and closed;
every answer with status 400 or more says `Connection: close` (though after a malformed
request line or header the server reads on); `100 Continue` is sent only when a handler reads
the body; headers are written in insertion order: the default `Server: llama.cpp`, the
handler's, Content-Length, then Keep-Alive or Connection. Its error handler
(tools/server/server-http.cpp) gives 404s a JSON body; its own refusals have none.

whisper-server (0.20.0): no line or header-count limit; no framing checks (Content-Length and
Transfer-Encoding together are read as chunked; a POST, PUT, PATCH or DELETE with neither is
read to the client's close, `read_content_without_length`); nothing is written once the client
has half-closed; a target past 8,192 bytes is answered after
a second header block is read; `Connection: close` and HTTP/1.0 `Keep-Alive` are matched
exactly; `Expect: 100-continue` (exactly) is answered `100 Continue` at once; errors keep the
connection. Its error handler (examples/server/server.cpp) answers 400 `Invalid request` and
every other error as 404 `File Not Found (<path>)`, text/plain. Its headers live in a
`std::unordered_multimap` hashed by `case_ignore::hash`, so they are written in libstdc++'s
bucket order, which httplib_order.py reproduces.
"""

from __future__ import annotations

from http import HTTPStatus

import attrs

from gpugate.proxy.dialects.base import AnswerVersion, ContinueRule, Framing, Refusal, RequestHead
from gpugate.proxy.dialects.httplib_chunked import HttplibChunkReader
from gpugate.proxy.dialects.httplib_head import (
    HEADER_MAX_COUNT,
    HEADER_MAX_LENGTH,
    MAX_LINE_LENGTH,
    HttplibHeadReading,
    Release,
    token_has,
)
from gpugate.proxy.dialects.httplib_order import table_order

REQUEST_URI_MAX_LENGTH = 8192
KEEPALIVE_MAX_COUNT = 100
KEEPALIVE_TIMEOUT_SECOND = 5
KEEP_ALIVE = f"timeout={KEEPALIVE_TIMEOUT_SECOND}, max={KEEPALIVE_MAX_COUNT}"
PHRASES = {413: "Payload Too Large", 414: "URI Too Long", 422: "Unprocessable Content"}
"""Where httplib's `status_message` differs from Python's phrases."""


def _phrase(status: int) -> str:
    if status in PHRASES:
        return PHRASES[status]
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "Internal Server Error"


@attrs.frozen(slots=True)
class HttplibDialect(HttplibHeadReading):
    """One runtime's cpp-httplib: its release, default headers and error handler's bodies
    (module docstring: the rules and sources; its head reader in httplib_head.py)."""

    name: str
    answers = AnswerVersion.HTTP11
    chunks_any_version = False
    keeps_as_head_said = False
    answers_after_client_end = True
    release: Release
    default_headers: tuple[tuple[str, str], ...]
    bad_request_body: tuple[str, bytes] | None
    """The error handler's answer to 400 (content type, body); None: no body."""
    not_found_body: bool
    """The error handler turns every other error into a 404 `File Not Found (<path>)`."""
    uri_max: int = REQUEST_URI_MAX_LENGTH
    """CPPHTTPLIB_REQUEST_URI_MAX_LENGTH as the runtime builds it."""

    def _answer(
        self,
        status: int,
        headers: list[tuple[str, str]],
        body: bytes,
        *,
        close: bool,
        version: tuple[int, int] = (1, 1),
        head: bool = False,
    ) -> bytes:
        length = len(body)
        return self.answer_head(status, headers, b"", length=length, close=close, head=head) + (
            b"" if head else body
        )

    def _refuse(self, status: int, path: str, *, close: bool, keep: bool = False) -> Refusal:
        """The error answer `write_response` writes, through the runtime's error handler."""
        headers: list[tuple[str, str]] = []
        body = b""
        if status == 400 and self.bad_request_body is not None:
            kind, body = self.bad_request_body
            headers.append(("Content-Type", kind))
        elif self.not_found_body and status not in (400, 500):
            status = 404
            body = f"File Not Found ({path})".encode("latin-1")
            headers.append(("Content-Type", "text/plain"))
        said_close = True if self.release is Release.V0_58 else close and not keep
        data = self._answer(status, headers, body, close=said_close)
        return Refusal(data, close=close)

    @property
    def defers_continue(self) -> bool:
        """0.58 sends `100 Continue` only when a handler reads the body; a handler that
        answers without reading it says `Connection: close` and closes
        (`write_response_core`, `process_request`'s drain). 0.20 sends it at once."""
        return self.release is Release.V0_58

    @property
    def continue_rule(self) -> ContinueRule:
        """When the listener writes `100 Continue`. 0.20 writes it in `process_request`
        before routing, whatever the route does with the body (httplib.h: `Expect` exactly
        `100-continue`, no `expect_100_continue_handler_` set by server.cpp), so at
        dispatch. 0.58 writes it when a handler reads the body (`defers_continue`), which
        the gate cannot see of the runtime's handler: it invites a body that has not come
        when it relays it."""
        if self.release is Release.V0_20:
            return ContinueRule.DISPATCH
        return ContinueRule.BODY_PENDING

    @property
    def relays_broken_body(self) -> bool:
        """0.58 reads a body only once a route matched (`Server::routing`: a regular
        handler's body is read in `dispatch_request` after the match; a miss is answered
        404 unread): a body relayed to the runtime whose chunked coding broke at the
        client goes up broken, and the runtime's answer is the client's. 0.20 reads a
        POST's body in `routing` before any route (`expect_content`), so its refusal is
        the listener's own."""
        return self.release is Release.V0_58

    @property
    def drops_read_ahead(self) -> bool:
        """Bytes read past a request's end in the same read are dropped, not read as the
        next request: each request has its own `SocketStream` and read buffer
        (`process_server_socket`). True for both releases."""
        return True

    @property
    def answers_after_eof(self) -> bool:
        """0.20 writes nothing once the client has half-closed: `write_data` asks
        `SocketStream::is_writable`, whose `is_socket_alive` peeks the FIN. So a body read
        to the close, or an unfinished head, is never answered. 0.58 still answers."""
        return self.release is Release.V0_58

    def says_close(self, head: RequestHead) -> bool:
        """Whether the answer says `Connection: close` (answer_head's `close`): only when
        the request said it (0.58: the token, any case; 0.20: exactly `close`), not for an
        HTTP/1.0 request the server closes anyway, whose answer says Keep-Alive."""
        values = [v for n, v in head.headers if n.lower() == "connection"]
        if self.release is Release.V0_58:
            return any(token_has(v, "close") for v in values)
        return values[:1] == ["close"]

    def fits(self, head: bytes) -> bool:
        """Whether the server reads this request head (as the gate sends one upstream):
        each field line, its CRLF included, within CPPHTTPLIB_HEADER_MAX_LENGTH, and (0.58)
        at most CPPHTTPLIB_HEADER_MAX_COUNT fields (`read_headers`). The request line is
        the client's, which the server's own line limit already passed."""
        lines = head.count(b"\r\n") - 2  # less the request line and the blank line
        if self.release is Release.V0_58 and lines > HEADER_MAX_COUNT:
            return False
        if len(head) <= HEADER_MAX_LENGTH:
            return True  # no field can be longer than the head
        return all(len(line) + 2 <= HEADER_MAX_LENGTH for line in head.split(b"\r\n")[1:])

    @property
    def needs_host(self) -> bool:
        """cpp-httplib's server asks for no `Host` (`process_request` reads none), and
        neither runtime's routes read it (llama-server's router sets its own on what it
        sends its children, server-models.cpp): a head the gate would push past `fits`
        with a Host the client did not send goes up without one."""
        return False

    @property
    def keep_alive_max(self) -> int:
        """Requests one connection carries: `process_server_socket_core` counts every
        request it reads, a refused one too, and calls the last with `close_connection`."""
        return KEEPALIVE_MAX_COUNT

    def relayed_connection(
        self, head: RequestHead, status: int, *, last: bool
    ) -> tuple[bytes, bool]:
        """The `Connection: close` or `Keep-Alive` line the server writes on a handler's
        answer to this client, which takes the place of the one the runtime wrote on its
        answer to the gate (another connection, with its own count and its own
        `Connection` header), and whether the connection ends after it.

        `write_response_core` says close for the connection's last request (`last`), for a
        request that said it and (0.58) for every status from 400, else Keep-Alive (an
        HTTP/1.0 request without keep-alive included, though its connection ends). The
        connection ends after the last request, after a request that does not keep it
        (`closes_after`), and (0.58) after an answer from 400 on to a framed body: 0.58
        drains a body its handler left unread only when the answer keeps the connection
        (`process_request`), and the gate takes an answer under 400 as one whose handler
        read its body or let it be drained. (llama-server also ends the connection after
        every streamed answer, its line unchanged: the gate keeps it, see
        docs/reliability.md.)"""
        said = last or self.says_close(head)
        if self.release is Release.V0_58 and status >= 400:
            said = True
        line = b"Connection: close\r\n" if said else b"Keep-Alive: %b\r\n" % KEEP_ALIVE.encode()
        return line, last or self.closes_after(head, status, body_read=status < 400)

    def closes_after(self, head: RequestHead, status: int, *, body_read: bool) -> bool:
        """Whether the connection ends after this answer: the request asked for it, or
        (0.58) an answer saying `Connection: close` — every status from 400 — leaves a
        framed body unread (`process_request`: no drain once close is said)."""
        if not head.keep_alive:
            return True
        unread = head.framing is not Framing.NONE and not body_read
        return self.release is Release.V0_58 and unread and (status >= 400 or head.expect_continue)

    def chunks(self) -> HttplibChunkReader:
        """A reader for one chunked body; malformed framing is the runtime's 400."""
        # 0.20's failed read is an ordinary 400 on a kept connection (its buffer dropped);
        # 0.58 says close from 400 on and stops at the broken body.
        v58 = self.release is Release.V0_58
        return HttplibChunkReader(self._refuse(400, "", close=v58), strict=v58)

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
        head: bool = False,
    ) -> bytes:
        """The head httplib writes for a handler's answer: no Date; the default headers
        (a value for one of them in `headers` — the runtime's own — replaces it); `headers`;
        Content-Length (none when chunked: httplib then writes `Transfer-Encoding:
        chunked` from its content provider); Keep-Alive or `Connection: close` (llama-server:
        always close from 400 on); `Accept-Ranges: bytes` for a HEAD (`head`). llama-server
        keeps insertion order, whisper-server its hash table's order. `version` is
        ignored: httplib answers every request in HTTP/1.1."""
        defaults = {name.lower() for name, _ in self.default_headers}
        own = [(n, v) for n, v in headers if n.lower() not in defaults]
        given = {n.lower(): v for n, v in headers if n.lower() in defaults}
        base = [(n, given.get(n.lower(), v)) for n, v in self.default_headers]
        added: list[tuple[str, str]] = list(own)
        if length is None:
            added.append(("Transfer-Encoding", "chunked"))
        elif length:
            # set_content sets it with the body, before write_response_core's headers.
            added.append(("Content-Length", str(length)))
        if close or (self.release is Release.V0_58 and status >= 400):
            added.append(("Connection", "close"))
        else:
            added.append(("Keep-Alive", KEEP_ALIVE))
        if length == 0:
            added.append(("Content-Length", "0"))
        if head:
            added.append(("Accept-Ranges", "bytes"))
        ordered = base + added
        if self.release is Release.V0_20:
            order = table_order(tuple(n for n, _ in base), tuple(n for n, _ in added))
            ordered = [ordered[index] for index in order]
        lines = [f"HTTP/1.1 {status} {_phrase(status)}"] + [f"{n}: {v}" for n, v in ordered]
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")

    def on_eof_mid_head(self, buffer: bytes, date: bytes, *, first: bool = True) -> Refusal | None:
        """A half-close with an unfinished head (`first` changes nothing here): the line
        reader returns what it has at end of stream, so the request line or the header
        block fails, 400; the connection then ends. Nothing read: closed without a word."""
        if not buffer or not self.answers_after_eof:
            return None
        if buffer.find(b"\r\n") > MAX_LINE_LENGTH:
            return Refusal(b"", close=True)
        first = self.read_head(buffer, date)
        if isinstance(first, Refusal):
            return Refusal(first.data, close=True)
        return Refusal(self._refuse(400, "", close=True).data, close=True)


DIALECT = HttplibDialect(
    name="httplib",
    release=Release.V0_58,
    default_headers=(("Server", "llama.cpp"),),
    bad_request_body=None,
    not_found_body=False,
    uri_max=32768,
)
"""llama-server's: cpp-httplib 0.58.0, `Server: llama.cpp` (server-http.cpp), targets up to
32,768 bytes (vendor/cpp-httplib/CMakeLists.txt raises CPPHTTPLIB_REQUEST_URI_MAX_LENGTH: as
long as the line limit, so its 414 cannot happen: a longer line is closed first)."""

WHISPER = HttplibDialect(
    name="httplib-0.20",
    release=Release.V0_20,
    default_headers=(
        ("Server", "whisper.cpp"),
        ("Access-Control-Allow-Origin", "*"),
        ("Access-Control-Allow-Headers", "content-type, authorization"),
    ),
    bad_request_body=("text/plain", b"Invalid request"),
    not_found_body=True,
)
"""whisper-server's: cpp-httplib 0.20.0 with its default headers and error handler
(examples/server/server.cpp `set_default_headers`, `set_error_handler`)."""
