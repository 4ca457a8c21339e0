"""The upstream's answer written down to the client as it arrives, and the gate's own.

The runtime's answer is written as the runtime wrote it, with no server framework composing
it again: its status line and header lines byte for byte less the hops, the gate's own
headers after them. The gate frames the body itself:

* a body that arrived whole and exactly as long as its Content-Length goes down in one
  write with the head;
* a body relayed as it arrives (NDJSON, SSE, a large file) keeps the runtime's
  Content-Length, else is chunked by the gate (an HTTP/1.0 client gets it unframed and
  the connection's end); the head goes down at once when it came alone, else with the
  first body bytes in the same write; each later part is one write, with no wait unless
  the client's transport is over its high-water mark;
* HEAD, 204 and 304 answers carry no body.

The runtime's own `Connection: close` is passed on and the client's connection is closed
after the answer, as it would be talking to the runtime directly (ComfyUI closes after its
500s). A cpp-httplib runtime's connection line is its server's for the connection it
answers, so the gate writes the one that server would write for the client's own
connection in its place, and ends that connection where that server would
(`HttplibDialect.relayed_connection`: its 100-request count among its rules). The
answers the gate writes itself (`send_answer`) take the head of the runtime's server
(`HttpDialect.answer_head`).
"""

from __future__ import annotations

from collections.abc import Iterable

from gpugate.proxy.dialects.base import AnswerVersion
from gpugate.proxy.forward import HOP_BYTES
from gpugate.proxy.http1_response import Response, UpstreamTimeout
from gpugate.proxy.request import Request, http_date

LAST_CHUNK = b"0\r\n\r\n"
WHOLE_BODY_LIMIT = 256 * 1024
"""A response whose length the upstream announced and that is at most this big is sent
down in one write with its headers (a non-streamed answer), instead of chunk by chunk."""
NO_BODY = frozenset({204, 304})
"""Statuses whose answers have no body, whatever their headers say."""
CLOSE_LINE = b"Connection: close\r\n"
CHUNKED_LINE = b"Transfer-Encoding: chunked\r\n"
KEEP_ALIVE_LINE = b"Connection: keep-alive\r\n"
_CONNECTION_LINE = {
    (False, True): b"",
    (False, False): CLOSE_LINE,
    (True, True): KEEP_ALIVE_LINE,
    (True, False): b"",
}
"""The `Connection` line of a relayed answer, by (answered in another version than HTTP/1.1,
connection kept): aiohttp and Go write `Connection: close` only on an HTTP/1.1 answer."""
HTTP11 = b"HTTP/1.1"
HTTP10 = b"HTTP/1.0"


def answer_version(request: Request) -> bytes:
    """The version of the status line the runtime's server writes for this request (its
    dialect's `AnswerVersion`)."""
    version = request.version
    answers = request.dialect.answers
    if version == (1, 1) or answers is AnswerVersion.HTTP11:
        return HTTP11
    if version == (1, 0):
        return HTTP10
    if answers is AnswerVersion.AS_ASKED:
        return b"HTTP/%d.%d" % version
    return HTTP11


class UpstreamBroken(Exception):
    """The upstream failed after the client's response had started: cut the client off."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__(str(cause))
        self.cause = cause


def send_answer(
    request: Request,
    status: int,
    headers: list[tuple[str, str]],
    body: bytes,
    *,
    close: bool = False,
) -> None:
    """Write an answer the gate makes itself, with the head the runtime's server writes;
    `close` (or a request that does not keep its connection) ends the connection after it.
    A client already gone is no failure: there is no one to answer."""
    ends = close or not request.keep_alive
    if ends:
        request.close = True
    dialect = request.dialect
    said = ends
    says = dialect.says_close
    if says is not None:
        # cpp-httplib says close only when the request said it (an HTTP/1.0 request's
        # answer says Keep-Alive, then the connection ends), on the connection's last
        # request, or when the gate itself ends it.
        last = last_request(request)
        if last:
            request.close = True
        said = close or last or says(request.head)
    head = dialect.answer_head(
        status,
        headers,
        http_date(),
        length=len(body),
        close=said,
        version=request.version,
        method=request.method,
    )
    if request.method == "HEAD" or status in NO_BODY:
        body = b""
    try:
        request.send(head + body)
    except ConnectionError:
        request.cut()


def _closes(upstream: Response) -> bool:
    """The runtime itself ends the connection after this answer (not because the gate
    asked it to: a pool that never reuses sends `Connection: close`, `Response.announce`)."""
    if upstream.announce is not None:
        return False
    connection = upstream.header(b"connection")
    return connection is not None and b"close" in (
        t.strip().lower() for t in connection.split(b",")
    )


async def stream_down(
    request: Request,
    upstream: Response,
    extra_headers: Iterable[tuple[str, str]],
    idle: float,
    *,
    prefix: bytes = b"",
) -> None:
    """Write the upstream's response to the client as it arrives.

    Raises UpstreamTimeout when the upstream stalls before anything went down,
    UpstreamBroken when it stalls or fails after. A client that goes while its answer is
    written only ends the answer (its connection closed): nothing is raised for it.
    """
    status = upstream.status
    length = upstream.content_length
    version = answer_version(request)
    own = _httplib_connection(request, status)
    if own is not None:
        # cpp-httplib's line for the client's connection in place of the runtime's
        connection, ends = own
        if ends:
            request.close = True
        close = b""
    else:
        connection = None
        if _closes(upstream):
            request.close = True
        # An HTTP/1.0 answer ends with the connection unless it says keep-alive, which Go's
        # net/http and aiohttp say to a keep-alive request when the answer's end is known.
        sized = length is not None or request.method == "HEAD" or status in NO_BODY
        kept = request.keep_alive and (request.version >= (1, 1) or (version == HTTP10 and sized))
        if request.dialect.keeps_as_head_said:
            kept = request.keep_alive
        if not kept:
            request.close = True
        close = _CONNECTION_LINE[version != HTTP11, kept]
    try:
        if request.method == "HEAD" or status in NO_BODY:
            request.send(
                runtime_head(upstream, extra_headers, close, version=version, connection=connection)
            )
            return
        if not prefix and length is not None and length <= WHOLE_BODY_LIMIT:
            body = await upstream.read(length + 1, idle) if length else b""
            if len(body) == length:
                head = runtime_head(
                    upstream, extra_headers, close, version=version, connection=connection
                )
                request.send(head + body)
                return
            # Shorter than it said (the upstream ended early) or longer: what arrived,
            # framed by the gate.
            framing = close + b"Content-Length: %d\r\n" % len(body)
            request.send(
                runtime_head(
                    upstream,
                    extra_headers,
                    framing,
                    own_length=True,
                    version=version,
                    connection=connection,
                )
                + body
            )
            return
        await _relay(request, upstream, extra_headers, idle, prefix, close, connection=connection)
    except ConnectionError:
        # The client's side closed while its answer was written: that is the client
        # leaving, never the runtime's failure; the upstream connection, its body unread,
        # is closed by the caller.
        request.cut()


async def _relay(
    request: Request,
    upstream: Response,
    extra_headers: Iterable[tuple[str, str]],
    idle: float,
    prefix: bytes,
    close: bytes,
    *,
    connection: bytes | None = None,
) -> None:
    """A body relayed as its parts arrive (see the module)."""
    chunked = upstream.content_length is None and (
        request.version == (1, 1) or request.dialect.chunks_any_version
    )
    if upstream.content_length is None and not chunked:
        request.close = True  # an HTTP/1.0 client: the body ends with the connection
    head = runtime_head(
        upstream,
        extra_headers,
        close + (CHUNKED_LINE if chunked else b""),
        version=answer_version(request),
        connection=connection,
    )
    if not prefix and not upstream.buffered and not upstream.complete:
        request.send(head)  # the runtime's head came alone: so does the gate's
        head = b""
    data = prefix
    while True:
        if data:
            if chunked:
                data = b"%x\r\n%b\r\n" % (len(data), data)
            if head:
                data = head + data
                head = b""
            request.send(data)
            await request.drain()
        try:
            data = await upstream.chunk(idle)
        except (UpstreamTimeout, OSError) as exc:
            if head:
                raise  # nothing went down yet: the gate's own answer can still be written
            raise UpstreamBroken(exc) from None
        if not data:
            break
    tail = LAST_CHUNK if chunked else b""
    if head or tail:
        request.send(head + tail)
    await request.drain()


_KEPT_HOPS = HOP_BYTES - {b"keep-alive"}
"""The hops of an answer to a client the gate keeps: the runtime's `Keep-Alive` is what it
would tell that client of its connection, so the client sees it (cpp-httplib's)."""
_KEPT_AND_LENGTH = _KEPT_HOPS | {b"content-length"}
_CONNECTION_FIELDS = frozenset({b"connection", b"keep-alive"})


def _httplib_connection(request: Request, status: int) -> tuple[bytes, bool] | None:
    """For a cpp-httplib runtime, the connection line its server writes on this answer to
    this client and whether the connection ends after it (`relayed_connection`); None for
    other servers."""
    relayed = request.dialect.relayed_connection
    if relayed is None:
        return None
    return relayed(request.head, status, last=last_request(request))


def last_request(request: Request) -> bool:
    """The request is the last its server takes on the connection (cpp-httplib's
    `keep_alive_max`, counted as the listener counts them: server.py `requests`)."""
    most = request.dialect.keep_alive_max
    return most is not None and getattr(request.conn, "requests", 0) >= most


def _dropped(upstream: Response, base: frozenset[bytes]) -> frozenset[bytes] | set[bytes]:
    """The header names not to pass down: `base` and what the runtime's `Connection` names."""
    connection = upstream.header(b"connection")
    if connection is None:
        return base
    return base | {t.strip().lower() for t in connection.split(b",") if t.strip()}


def runtime_head(
    upstream: Response,
    extra_headers: Iterable[tuple[str, str]],
    framing: bytes = b"",
    *,
    own_length: bool = False,
    version: bytes = HTTP11,
    connection: bytes | None = None,
) -> bytes:
    """The runtime's status line and header lines less the hops (and what its `Connection`
    header names; its Content-Length too when `own_length`), then the gate's headers and
    `framing` (header lines), then the blank line; for a client the gate keeps. The
    runtime's `Keep-Alive` stays, and where the gate's own `Connection: close` took it out
    (`Response.announce`), it is put back. `connection` (a whole line): written in place of
    the runtime's last `Connection` or `Keep-Alive` line, any before it kept."""
    drop = _dropped(upstream, _KEPT_AND_LENGTH if own_length else _KEPT_HOPS)
    announce = upstream.announce
    # cpp-httplib writes its own `Transfer-Encoding: chunked` among the answer's headers
    # (`write_response_core`, before the connection line): the gate's chunking takes
    # that place where the runtime chunked too.
    chunked_in_place = connection is not None and framing == CHUNKED_LINE
    # The server's own connection line is the last of its answer's: one a handler set
    # before it (llama-server's router copies its child's `Connection: close`) is the
    # runtime's and goes down as it is.
    own_line = -1
    if connection is not None:
        for index, (name, _) in enumerate(upstream.raw_headers):
            if name.lower() in _CONNECTION_FIELDS:
                own_line = index
    parts = [b"%b %d %b\r\n" % (version, upstream.status, upstream.reason.encode("latin-1"))]
    for index, (name, value) in enumerate(upstream.raw_headers):
        lowered = name.lower()
        if chunked_in_place and lowered == b"transfer-encoding":
            parts.append(CHUNKED_LINE)
            framing = b""
            chunked_in_place = False
        elif index == own_line:
            parts.append(connection or b"")
            connection = b""
        elif (connection is not None and lowered in _CONNECTION_FIELDS) or lowered not in drop:
            parts += (name, b": ", value, b"\r\n")
        elif announce is not None and lowered == b"connection":
            # The gate's own `Connection: close` took the runtime's Keep-Alive out.
            parts += (b"Keep-Alive: ", announce, b"\r\n")
            announce = None
    for name, value in extra_headers:
        parts += (name.encode(), b": ", value.encode("utf-8", "surrogateescape"), b"\r\n")
    parts += (connection or b"", framing, b"\r\n")
    return b"".join(parts)
