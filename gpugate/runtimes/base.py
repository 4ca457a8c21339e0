"""What every runtime adapter answers about a request, and the error shapes clients parse."""

from __future__ import annotations

import enum
import json

import attrs

from gpugate.core.failures import Failure


class ApiFamily(enum.Enum):
    """Which error shape a client of this route parses."""

    OLLAMA = "ollama"
    """Ollama /api/*: {"error": "..."} (always a JSON object)."""
    OPENAI = "openai"
    """OpenAI-compatible /v1/*: {"error": {"message", "type", "param", "code"}}."""
    PLAIN = "plain"
    """Anything else: a text body."""


class RouteKind(enum.Enum):
    PASS = "pass"
    """Cannot put a model in VRAM: forwarded untouched, no lease."""
    DEMAND = "demand"
    """May load a model: forwarded only under a lease."""
    UNLOAD = "unload"
    """Asks the runtime to unload a model: forwarded, then the books are reconciled."""
    REFUSE = "refuse"
    """Malformed in a way the runtime would refuse: the gate answers as the runtime would."""


@attrs.frozen
class Refusal:
    status: int
    message: str


@attrs.frozen
class Classified:
    """An adapter's reading of one request."""

    kind: RouteKind
    api: ApiFamily
    model: str | None = None
    options_key: str = ""
    """Runner options that decide a reload (the lease key's second half)."""
    body: bytes | None = None
    """The body to forward when the adapter rewrote it; None forwards the original."""
    idle_ttl: float | None = None
    """How long the model may stay idle after this request (None: forever)."""
    sets_ttl: bool = False
    """Whether this request sets the model's idle time (Ollama's sticky keep_alive)."""
    refusal: Refusal | None = None


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


@attrs.frozen
class Screening:
    """What a runtime's own checks (Host, Origin) say before a request is routed.

    The checks are those of the runtime listening where the gate listens; the runtime behind
    the gate sees the gate's request, so the gate answers for it.
    """

    reply: ErrorReply | None = None
    """Answer this instead of forwarding (a refusal, or a preflight the checks answer)."""
    response_headers: tuple[tuple[str, str], ...] = ()
    """Headers to add to the upstream's answer (CORS headers naming the client's origin)."""
    drop_up: tuple[str, ...] = ()
    """Request headers not to send upstream (already judged here)."""


def go_json(value: object) -> bytes:
    """JSON as Go's encoding/json writes it: compact, UTF-8, HTML characters escaped."""
    text = json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    for char, escaped in _GO_ESCAPES:
        text = text.replace(char, escaped)
    return text.encode()


_GO_ESCAPES = (
    ("<", "\\u003c"),
    (">", "\\u003e"),
    ("&", "\\u0026"),
    ("\u2028", "\\u2028"),
    ("\u2029", "\\u2029"),
)


def error_reply(
    api: ApiFamily, status: int, message: str, *, code: str | None = None
) -> ErrorReply:
    """An error body as the runtime behind `api` would write it."""
    if api is ApiFamily.OLLAMA:
        # gin's c.JSON
        body = go_json({"error": message})
        return ErrorReply(status, body, "application/json; charset=utf-8", code)
    if api is ApiFamily.OPENAI:
        # json.NewEncoder(w).Encode: a trailing newline
        kind = {400: "invalid_request_error", 404: "not_found_error"}.get(status, "api_error")
        payload = {"error": {"message": message, "type": kind, "param": None, "code": code}}
        return ErrorReply(status, go_json(payload) + b"\n", "application/json", code)
    return ErrorReply(status, (message + "\n").encode(), "text/plain; charset=utf-8", code)


def failure_reply(api: ApiFamily, failure: Failure) -> ErrorReply:
    """A gate failure in the client's shape, with its status and Retry-After."""
    cls = failure.failure_class
    reply = error_reply(api, cls.http_status, failure.message, code=cls.value)
    return attrs.evolve(reply, failure_class=cls.value, retry_after=failure.retry_after)
