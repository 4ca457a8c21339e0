"""What every server dialect answers: a request's head as its server reads it, and the
answers that server writes itself before any handler runs.

A dialect is one HTTP server's rules (Go's net/http, aiohttp's server, cpp-httplib), read
from its source and checked against the real server byte for byte (tests/dialects). The
listener (proxy/server.py) keeps the connection and the bytes; a dialect only reads and
answers, with no I/O and no clock: the `Date` value is passed in.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import Protocol

import attrs


class Framing(enum.Enum):
    """Where a request's body ends, as the server decides it."""

    NONE = "none"
    """No body: the next request starts right after the head."""
    LENGTH = "length"
    """`RequestHead.length` bytes."""
    CHUNKED = "chunked"
    """Chunked transfer coding, read by the dialect's `ChunkReader`."""
    UNTIL_CLOSE = "until-close"
    """Everything up to the client's close (cpp-httplib 0.20 reads a POST with neither
    Content-Length nor chunked coding so)."""


class ContinueRule(enum.Enum):
    """When the server writes `100 Continue` to a request that expects it
    (`RequestHead.expect_continue`): a dialect's `continue_rule`, `BODY_PENDING` where it
    has none."""

    FIRST_READ = "first-read"
    """On the handler's first read of the body, whether or not its bytes came with the
    head, unless the answer has begun (Go: server.go `expectContinueReader.Read`, disabled
    by `response.write`)."""
    DISPATCH = "dispatch"
    """As the request is handed to its handler, before anything of the body is read and
    whatever the handler does with it (aiohttp: web_app.py `_handle` runs the route's
    `expect_handler`, web_urldispatcher.py `_default_expect_handler`)."""
    BODY_PENDING = "body-pending"
    """When the handler first waits for a body none of whose bytes came with the head."""


class AnswerVersion(enum.Enum):
    """The version of the status line a server writes, by the request's version."""

    HTTP11 = "http/1.1"
    """Always HTTP/1.1 (cpp-httplib; uvicorn's httptools_impl.py `STATUS_LINE`)."""
    HTTP10_AS_ASKED = "http/1.0-as-asked"
    """HTTP/1.0 to an HTTP/1.0 request, else HTTP/1.1, `PRI * HTTP/2.0` included (Go:
    server.go `writeHeader`)."""
    AS_ASKED = "as-asked"
    """The request's own version, HTTP/2.0 and 0.9 included (aiohttp: web_response.py
    `_write_headers`)."""


@attrs.frozen(slots=True)
class RequestHead:
    """A request line and header fields as the server read them."""

    method: str
    """As the server passes it on (Go: as sent; a lowercase method is a different method)."""
    target: str
    """The request-target as sent, decoded as latin-1."""
    version: tuple[int, int]
    """The version as the server read it (Go reads `HTTP/1.2` as 1.2 and serves it)."""
    headers: tuple[tuple[str, str], ...]
    """Names and values as the server keeps them, in the order received (Go canonicalises
    names and unfolds continuation lines; aiohttp keeps names as sent), latin-1 decoded."""
    framing: Framing
    length: int
    """The body's length for `Framing.LENGTH`, else 0."""
    keep_alive: bool
    """Whether the server would keep the connection open after answering this request."""
    expect_continue: bool
    """The server sends `100 Continue` (when: the dialect's `ContinueRule`)."""
    upgrade: bool
    """The request asks to switch protocols (a websocket handshake)."""
    size: int
    """How many bytes of the buffer the head took (including its blank line)."""


@attrs.frozen(slots=True)
class Refusal:
    """An answer the server writes by itself, byte for byte, and what it does after."""

    data: bytes
    """Status line, header fields and body, exactly as the server writes them."""
    close: bool
    """The server closes the connection after writing it."""


@attrs.frozen(slots=True)
class Chunks:
    """What a `ChunkReader` made of the bytes it was fed."""

    data: bytes
    """Body bytes decoded (possibly empty)."""
    used: int
    """How many of the fed bytes it consumed; the rest belongs to the next request."""
    done: bool
    """The last chunk and the trailer were read."""
    refusal: Refusal | None = None
    """The chunked coding is malformed: the server's answer (the body is not read further)."""
    error: str = ""
    """The chunked coding is malformed and the server writes nothing itself: the error its
    handler reads instead (Go: the handler answers, then the server closes)."""


class ChunkReader(Protocol):
    """A chunked body decoded incrementally, by the server's own rules."""

    def feed(self, data: bytes, date: bytes) -> Chunks:
        """Decode what `data` holds; keep a partial chunk line for the next call."""
        ...


class HttpDialect(Protocol):
    """One HTTP server's reading of requests and its own answers."""

    name: str
    answers: AnswerVersion
    """The status line's version for each request version."""
    chunks_any_version: bool
    """An answer of unknown length is chunked whatever the request's version (uvicorn:
    httptools_impl.py `RequestResponseCycle.send`); otherwise only to HTTP/1.1, an older
    client reading the body to the connection's end."""
    keeps_as_head_said: bool
    """Whether the connection is kept was decided at the request's head (uvicorn:
    `RequestResponseCycle.keep_alive`, so an HTTP/0.9 or 2.0 request saying keep-alive is
    kept); otherwise by the answer too (an HTTP/1.0 answer of unknown length ends it)."""
    answers_after_client_end: bool
    """A client that half-closes once its request is whole still gets the answer, and the
    runtime reads that end as its server would (cpp-httplib reads nothing more of the
    connection while its handler runs: llama-server answers a non-streamed completion in
    full and stops a stream where its `is_connection_closed` sees the end); otherwise the
    client's end is its going (Go cancels the request's context, aiohttp and uvicorn close
    the transport)."""

    def read_head(self, buffer: bytes, date: bytes) -> RequestHead | Refusal | None:
        """The next request's head at the start of `buffer`; None while it is incomplete
        and still within the server's limits; the server's `Refusal` when it would refuse
        it (a malformed line, a header past its limit, an unsupported version or framing).
        `date` is the `Date` header's value for an answer written now."""
        ...

    def chunks(self) -> ChunkReader:
        """A reader for one chunked body."""
        ...

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
        """The head of an answer the gate writes itself (its refusals, its JSON errors) in
        the server's own shape: its status line and reason, `headers` (the answer's own:
        Content-Type, the runtime's CORS, X-GPUGate-*) placed where the server places its
        handler's headers, and the headers the server adds itself (Date, Content-Length
        or Transfer-Encoding, Connection, Server), in its order. `length` None: chunked.
        `version` and `method` are the request's (Go answers an HTTP/1.0 request in
        HTTP/1.0, and a HEAD with no body length)."""
        ...

    # The rules `ServerDefaults` gives every dialect, each None where it does not apply.
    continue_rule: ContinueRule
    peek_before_next: int
    skip_before_head: Callable[[bytes, str], int] | None
    own_answer: Callable[[RequestHead, bytes], Refusal | None] | None
    drops_read_ahead: bool
    keep_alive_max: int | None
    says_close: Callable[[RequestHead], bool] | None
    relayed_connection: Callable[..., tuple[bytes, bool]] | None
    fits: Callable[[bytes], bool] | None
    needs_host: bool
    relays_broken_body: bool
    expectation_failed: Callable[[RequestHead, bytes], bytes | None] | None

    def on_eof_mid_head(self, buffer: bytes, date: bytes, *, first: bool = True) -> Refusal | None:
        """What the server writes when the client half-closes with an unfinished head
        (None: it closes without a word); `first`: no request came before it on the
        connection."""
        ...


class ServerDefaults:
    """The rules a server keeps unless its dialect says otherwise (each dialect's class
    derives from this): the listener reads every rule as the dialect's own attribute, and
    a rule that does not apply is None."""

    __slots__ = ()

    continue_rule: ContinueRule = ContinueRule.BODY_PENDING
    """When `100 Continue` is written (`ContinueRule`)."""
    peek_before_next: int = 0
    """Bytes the server waits for after an answer before it reads a next request (Go: 4)."""
    skip_before_head: Callable[[bytes, str], int] | None = None
    """How many bytes before a next head the server drops, given the buffer and the last
    request's method (Go: a POST's stray line ends)."""
    own_answer: Callable[[RequestHead, bytes], Refusal | None] | None = None
    """An answer the server writes itself to a head it read well (Go: `OPTIONS *`)."""
    drops_read_ahead: bool = False
    """Whether what the server read past a request's end is lost with it (cpp-httplib)."""
    keep_alive_max: int | None = None
    """The most requests the server takes on one connection (cpp-httplib)."""
    says_close: Callable[[RequestHead], bool] | None = None
    """Whether an answer the gate writes itself says `Connection: close` to this request
    (cpp-httplib's rule); None: whenever the connection ends."""
    relayed_connection: Callable[..., tuple[bytes, bool]] | None = None
    """The connection line the server writes on a relayed answer, and whether the
    connection ends after it (cpp-httplib); None: the runtime's own, as the gate keeps it."""
    fits: Callable[[bytes], bool] | None = None
    """Whether the server reads a head the gate made (its limits); None: any head."""
    needs_host: bool = True
    """Whether a request with no Host must be sent one (cpp-httplib reads none)."""
    relays_broken_body: bool = False
    """Whether a body that breaks on its way up is passed on as far as it came."""
    expectation_failed: Callable[[RequestHead, bytes], bytes | None] | None = None
    """The server's answer to an `Expect` it does not know, written as the request reaches
    its handler (aiohttp's 417)."""
