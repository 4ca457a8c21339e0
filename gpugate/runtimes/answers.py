"""What a runtime's parts answer about a request and a runtime, and the error shapes
clients parse (the parts themselves: parts.py)."""

from __future__ import annotations

import enum
import json
from datetime import datetime

import attrs

from gpugate.core.failures import Failure
from gpugate.core.tickets import LeaseScope
from gpugate.runtimes.comfyui.errors import comfyui_failure_reply
from gpugate.runtimes.replies import ErrorReply


class ApiFamily(enum.Enum):
    """Which error shape a client of this route parses."""

    OLLAMA = "ollama"
    """Ollama /api/*: {"error": "..."} (always a JSON object)."""
    OPENAI = "openai"
    """OpenAI-compatible /v1/*: {"error": {"message", "type", "param", "code"}}."""
    PLAIN = "plain"
    """Anything else: a text body."""
    VLLM = "vllm"
    """vLLM's OpenAI server: {"error": {"message", "type", "param", "code"}}, `code` the status."""
    LLAMA = "llama"
    """llama.cpp's server: {"error": {"code", "message", "type"}} on every route."""
    JOB_QUEUE = "job_queue"
    """A queue of jobs that answers `{"error": {"type", "message", "details", "extra_info"},
    "node_errors": {}}` (ComfyUI's `POST /prompt`); the adapter writes the gate's failures."""


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
    exact: ErrorReply | None = None
    """The whole answer, when the runtime's is not its API family's error shape."""


@attrs.frozen
class Classified:
    """A runtime's reading of one request."""

    kind: RouteKind
    api: ApiFamily
    model: str | None = None
    options_key: str = ""
    """Runner options that decide a reload (the lease key's second half)."""
    body: bytes | None = None
    """The body to forward when the reading rewrote it; None forwards the original."""
    idle_ttl: float | None = None
    """How long the model may stay idle after this request (None: forever)."""
    sets_ttl: bool = False
    """Whether this request sets the model's idle time (Ollama's sticky keep_alive)."""
    refusal: Refusal | None = None
    scope: LeaseScope = LeaseScope.REQUEST
    """How long the lease of a DEMAND lives, and who ends it (docs/architecture.md)."""
    reading: object = attrs.field(default=None, eq=False)
    """The runtime's own reading of the body, for its `Memory.size`, `Vetting` and
    `Jobs.job_key` (opaque elsewhere)."""
    scale: float = 0.0
    """How large the job is in the runtime's own unit (ComfyUI: megapixels); a measured
    peak is kept with the scale it was measured at."""
    appear_within: float | None = None
    """PROCESS scope: seconds the process has to show the lease's bytes in NVML."""
    replaces: str | None = None
    """The consumer's model the runtime frees itself before it loads this one (a process
    runtime switching models): the new model takes the old one's place, not room beside it."""


@attrs.frozen
class Vetted:
    """The runtime's own verdict on a demand, known before any lease."""

    reply: ErrorReply | None = None
    """The runtime's refusal, written by the gate; None: forward the request unleased, for
    the runtime to word its own refusal (nothing loads for it)."""
    runtime_decides: bool = False
    """Only the runtime can tell whether it refuses this job (its own code judges it, or
    only it can word the refusal), and it does so before it queues anything: the request
    is forwarded with no lease, and the job is leased (evicting whoever must make room)
    only once the runtime has accepted it. A refusal then costs nobody anything. JOB
    scope only: a request of another scope is leased before it goes up, as without it."""


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
    reply_headers: tuple[tuple[str, str], ...] = ()
    """Headers for every other answer the gate writes itself for this request (a refused
    body, a capacity failure, a 502 or 504): the CORS headers the runtime would have put on
    its own answer, so a page on another origin can read the gate's message. `reply` is
    complete as it is and does not take them."""
    target_as_sent: bool = True
    """An absolute-form request-target goes upstream as the client sent it (where the
    runtime's server takes that form, proxy/forward.py); False: in origin form, because the
    runtime behind the gate would take the authority it names as the request's host and
    refuse it, where the runtime at the gate's address serves it."""


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
    if api is ApiFamily.VLLM:
        # ErrorResponse(error=ErrorInfo(message, type, param, code)), FastAPI's JSON
        payload = {
            "error": {
                "message": message,
                "type": vllm_error_type(status),
                "param": None,
                "code": status,
            }
        }
        body = json.dumps(payload, separators=(",", ":"), ensure_ascii=False).encode()
        return ErrorReply(status, body, "application/json", code)
    if api is ApiFamily.LLAMA:
        # format_error_response (tools/server/server-common.cpp), dumped compact
        payload = {"error": {"code": status, "message": message, "type": llama_error_type(status)}}
        body = json.dumps(payload, separators=(",", ":"), ensure_ascii=False).encode()
        return ErrorReply(status, body, "application/json; charset=utf-8", code)
    return ErrorReply(status, (message + "\n").encode(), "text/plain; charset=utf-8", code)


_LLAMA_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    501: "not_supported_error",
    503: "unavailable_error",
}


def vllm_error_type(status: int) -> str:
    """vLLM's error `type`: the name of the HTTP error class its handlers raise."""
    return {400: "BadRequestError", 404: "NotFoundError", 429: "RateLimitError"}.get(
        status, "ServiceUnavailableError" if status == 503 else "InternalServerError"
    )


def llama_error_type(status: int) -> str:
    """llama-server's error `type` for a status (its error_type enum); a status it never
    writes itself (429) reads as the retryable one, `unavailable_error`."""
    if status == 429:
        return "unavailable_error"
    return _LLAMA_TYPES.get(status, "server_error")


def failure_reply(api: ApiFamily, failure: Failure) -> ErrorReply:
    """A gate failure in the client's shape, with its status and Retry-After."""
    if api is ApiFamily.JOB_QUEUE:
        return comfyui_failure_reply(failure)
    cls = failure.failure_class
    reply = error_reply(api, cls.http_status, failure.message, code=cls.value)
    return attrs.evolve(reply, failure_class=cls.value, retry_after=failure.retry_after)


@attrs.frozen
class LoadedModel:
    """One model a runtime says it holds."""

    name: str
    size: int
    size_vram: int
    expires_at: datetime | None = None
    context_length: int | None = None
    sized: bool = True
    """False when the runtime names the model but not its size (`size` is then the adapter's
    estimate): the books keep what the model's lease counted, or what NVML measured."""


class AdapterError(Exception):
    """The runtime answered something the adapter cannot use."""


class NotSupported(AdapterError):
    """The runtime cannot answer this question (it has no listing, no health route)."""


@attrs.frozen
class ReclaimRule:
    """How an unload is confirmed from NVML."""

    recovered_fraction: float = 0.75
    """The device's free memory must rise by this fraction of the resident's bytes."""
    to_idle: bool = False
    """The runtime keeps a context while idle and gives back all else: the unload is done
    when NVML shows the consumer holding no more than its idle memory (learned while the
    books held nothing for it) and what its other residents and leases explain."""

    consumer_clear: bool = False
    """Also require NVML to show the consumer holding no more than its other residents
    explain: a stopped process is gone only when its memory left the consumer's row."""


@attrs.frozen
class Measured:
    """A peak NVML showed for an earlier job of the same kind, and the scale it ran at."""

    bytes: int
    scale: float | None = None


class HealthSignal(enum.Enum):
    """What tells the gate that a consumer's runtime is there and answering."""

    LISTING = "listing"
    """Its listing, asked every listing interval to keep the books in step."""
    HEALTH_ROUTE = "health_route"
    """Its health route (`health()`), asked every listing interval."""
    PROCESS = "process"
    """Its process: a stopped one is fine (it starts on demand), a running one must answer
    its health route."""
    UNOBSERVED = "unobserved"
    """Nothing: the runtime cannot say, and its absence does not make the gate unhealthy."""


@attrs.frozen
class JobEnd:
    """A job the runtime no longer has: finished, failed, interrupted or deleted."""

    job: str
    failed: bool = False
    detail: str = ""
