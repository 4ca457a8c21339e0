"""A response the gate writes itself; the shapes each runtime's clients parse build on it."""

from __future__ import annotations

from collections.abc import Callable

import attrs
from aiohttp import web


@attrs.frozen
class ErrorReply:
    """A response the gate writes itself, in the client's shape."""

    status: int
    body: bytes
    content_type: str
    failure_class: str | None = None
    retry_after: float | None = None
    headers: tuple[tuple[str, str], ...] = ()
    """More headers, in order (CORS headers on a refusal or a preflight answer)."""


TooLarge = Callable[[int, int, str], ErrorReply]
"""A runtime's answer to a body past `limit` bytes: (limit, bytes seen, request path)."""


@attrs.frozen
class BodyLimit:
    """The largest request body a runtime's HTTP server reads, and its answer past it."""

    size: int | None = None
    """Bytes the server reads at most; None: it sets no limit, and the gate keeps its own
    bound (`Consumer.body_limit`)."""
    refusal: TooLarge | None = attrs.field(default=None, eq=False)
    """Its whole answer, written before any middleware of the runtime adds to it; None: the
    route's API error shape with Go's words (413, `http: request body too large`)."""


def aiohttp_too_large(limit: int, seen: int, path: str) -> ErrorReply:
    """aiohttp's answer when a handler's `request.read()` passes `client_max_size`: the
    HTTPRequestEntityTooLarge it raises, worded by the installed aiohttp. Raised through
    the application's middleware, it reaches the client with none of their headers."""
    exc = web.HTTPRequestEntityTooLarge(limit, seen)
    return ErrorReply(exc.status, exc.body or b"", f"{exc.content_type}; charset={exc.charset}")


WHISPER_DEFAULT_HEADERS = (
    ("Server", "whisper.cpp"),
    ("Access-Control-Allow-Origin", "*"),
    ("Access-Control-Allow-Headers", "content-type, authorization"),
)
"""What whisper-server's `set_default_headers` puts on every answer (whisper.cpp 1.8.5
examples/server/server.cpp, before its routes)."""


def whisper_too_large(limit: int, seen: int, path: str) -> ErrorReply:
    """whisper-server's answer to a body cpp-httplib refuses as too large (413): its error
    handler runs on every status of 400 and up and turns all but 400 and 500 into 404."""
    body = f"File Not Found ({path})".encode("utf-8", "surrogateescape")
    return ErrorReply(404, body, "text/plain", headers=WHISPER_DEFAULT_HEADERS)
