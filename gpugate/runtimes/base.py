"""The runtime adapter interface, what an adapter answers about a request, and the error
shapes clients parse.

The gate, the unload runner, the listeners and `serve` know runtimes only through
`RuntimeAdapter`: adding a runtime is one adapter here and one entry in `registry.py`.
"""

from __future__ import annotations

import abc
import enum
import json
from collections.abc import Mapping
from datetime import datetime
from typing import ClassVar

import aiohttp
import attrs

from gpugate.config.model import Consumer, ModelOverride, Residency
from gpugate.core.classes import PriorityClass
from gpugate.core.failures import Failure
from gpugate.core.tickets import LeaseScope
from gpugate.runtimes.comfyui.errors import comfyui_failure_reply
from gpugate.runtimes.dialect import BodyCoding, ServerDialect
from gpugate.runtimes.process import ProcessControl
from gpugate.runtimes.replies import BodyLimit, ErrorReply


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
    scope: LeaseScope = LeaseScope.REQUEST
    """How long the lease of a DEMAND lives, and who ends it (docs/architecture.md)."""
    reading: object = attrs.field(default=None, eq=False)
    """The adapter's own reading of the body, for `size` and `job_key` (opaque elsewhere)."""
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
    """The runtime's own refusal of a demand, known before any lease."""

    reply: ErrorReply | None = None
    """The runtime's answer, written by the gate; None: forward the request unleased, for
    the runtime to word its own refusal (nothing loads for it)."""


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


class RuntimeAdapter(abc.ABC):
    """What the gate needs from one consumer's runtime; one instance per consumer.

    The base class holds the consumer's configuration lookups every runtime shares;
    a runtime family implements the request reading and the calls to its upstream.
    """

    reconcilable: ClassVar[bool] = False
    """The runtime's listing names its memory (its unknown memory gets a name soon)."""

    @property
    def health_signal(self) -> HealthSignal:
        """What the gate's health reads for this consumer: a reconcilable runtime is listed
        anyway, so its listing says it answers; others name their own signal."""
        return HealthSignal.LISTING if self.reconcilable else HealthSignal.UNOBSERVED

    reclaim_rule: ClassVar[ReclaimRule] = ReclaimRule()
    pool_connections: ClassVar[bool] = True
    """Upstream connections may be kept and reused; False opens one per request (a
    runtime whose idle connections close sooner than the gate would notice)."""

    dialect: ClassVar[ServerDialect] = ServerDialect.GO
    """The HTTP server the runtime is built on: how it frames, expects and decodes a
    request (dialect.py). The default is the strictest reading."""

    body_limit: ClassVar[BodyLimit] = BodyLimit()
    """The most request body the runtime's server reads, and its answer past it: the gate's
    default bound for a body it reads (none: the gate's own), refused as the runtime would."""

    process: ProcessControl | None = None
    """The runtime's process when the gate starts and stops it (its memory is the
    process's, from start to exit); None for a runtime the gate only talks to."""

    def __init__(self, consumer: Consumer) -> None:
        self.consumer = consumer
        self._overrides = {self.model_key(m.name): m for m in consumer.models}
        self._seen: dict[str, ModelOverride | None] = {}

    # -- configuration for a model ---------------------------------------------------------

    def model_key(self, name: str) -> str:
        """The gate's key for a model name as a client or the configuration writes it."""
        return name

    def override(self, model: str) -> ModelOverride | None:
        """The consumer's per-model settings for this model, if any."""
        # Looked up several times per request: remember by the name as clients write it.
        try:
            return self._seen[model]
        except KeyError:
            found = self._overrides.get(self.model_key(model))
            if len(self._seen) < 4096:
                self._seen[model] = found
            return found

    def residency(self, model: str) -> Residency:
        """The model's residency, else the consumer's."""
        override = self.override(model)
        return override.residency if override and override.residency else self.consumer.residency

    def model_priority(self, model: str) -> PriorityClass:
        """The model's class, else the consumer's."""
        override = self.override(model)
        return override.priority if override and override.priority else self.consumer.priority

    def configured_envelope(self, model: str) -> int | None:
        """The bytes consumers.yaml gives this model, if any."""
        override = self.override(model)
        return override.envelope if override and override.envelope else None

    def reload_seconds(self, model: str, nbytes: int) -> float:
        """Configured reload time, else a guess from the size (about 2 GiB/s from disk)."""
        override = self.override(model)
        if override and override.reload_seconds is not None:
            return override.reload_seconds
        return 1.0 + nbytes / (2 * 1024**3)

    def url(self, path: str) -> str:
        """The upstream's address for a path."""
        return self.consumer.upstream.url + path

    # -- reading requests ------------------------------------------------------------------

    def screen(self, method: str, headers: Mapping[str, str], *, target: str = "") -> Screening:
        """The runtime's own checks (Host, Origin) as it would run them where the gate listens.

        `target` is the request-target as the client wrote it (origin-form `/api/tags?x=1`,
        or absolute-form `http://host/api/tags`): some runtimes take the Host from it.
        """
        return Screening()

    def decoded_coding(self, path: str, content_encoding: str) -> BodyCoding | None:
        """A content coding the runtime undoes on this route before reading the body (beyond
        what its HTTP server undoes on every route: `dialect`); None: read it as sent."""
        return None

    @abc.abstractmethod
    def wants_body(self, method: str, path: str) -> bool:
        """Must the body be read to classify this request?"""

    def needs_process(self, method: str, path: str) -> bool:
        """Does this request need the runtime's process running (a process runtime: the
        gate starts it for such a request, and counts it busy while it runs)?"""
        return True

    @abc.abstractmethod
    def classify(
        self, method: str, path: str, body: bytes | None, content_type: str, *, query: str = ""
    ) -> Classified:
        """Whether a request may put a model in VRAM, under which lease scope, and its body
        (`query`: the URL's raw query string, for runtimes that read fields from it)."""

    vets: bool = False
    """Whether `vet` asks the runtime anything (the listener calls it for demands only then)."""

    async def vet(
        self, classified: Classified, session: aiohttp.ClientSession, now: float
    ) -> Vetted | None:
        """The runtime's own refusal of a demand, decided from what the runtime says of
        itself (ComfyUI's node catalog, an Ollama model's capabilities) before any lease;
        None: admit it. May raise the session's errors or AdapterError: the demand is then
        admitted unvetted."""
        return None

    def job_key(self, classified: Classified, body: bytes) -> str | None:
        """The runtime's name for the job a JOB request started, read from its answer."""
        return None

    sizes_requests: ClassVar[bool] = False
    """Whether `size` reads requests; the gate works out a ceiling only for those that do."""

    def size(
        self, classified: Classified, measured: Measured | None, ceiling: int | None
    ) -> int | None:
        """Bytes for a demand the adapter sizes from its body (None: configured, measured or
        estimated by model); `ceiling` is the most the card can give the consumer."""
        return None

    tracks_jobs: ClassVar[bool] = False
    """Its JOB leases end by `track_jobs`: the gate polls it while the consumer has jobs."""

    async def track_jobs(
        self, session: aiohttp.ClientSession, live: frozenset[str]
    ) -> list[JobEnd]:
        """Which of the live jobs (by the runtime's names) the runtime no longer has."""
        raise NotSupported(f"{self.consumer.name} cannot say when its jobs end")

    async def preempt(self, session: aiohttp.ClientSession, job: str) -> None:
        """Stop a running job for a demand of a class the consumer lets preempt it."""
        raise NotSupported(f"{self.consumer.name} cannot stop a job")

    # -- talking to the runtime ------------------------------------------------------------

    @abc.abstractmethod
    async def listing(self, session: aiohttp.ClientSession) -> list[LoadedModel]:
        """What the runtime holds; raises NotSupported when it cannot say (NVML decides)."""

    @abc.abstractmethod
    async def evict(self, session: aiohttp.ClientSession, model: str) -> None:
        """Ask the runtime to give a resident's memory back (unload, free, stop)."""

    async def estimate(
        self, session: aiohttp.ClientSession, model: str, options: str
    ) -> int | None:
        """Bytes a model will take before it was ever measured; None: the runtime lacks it."""
        raise NotSupported(f"{self.consumer.name} cannot size {model} before it is loaded")

    @abc.abstractmethod
    async def health(self, session: aiohttp.ClientSession) -> bool:
        """Whether the runtime answers as a healthy one does."""

    def evict_timeout(self) -> float:
        """How long an eviction may take (a process's stop takes its stop timeout)."""
        return self.consumer.timeouts.control

    # -- runtimes whose memory is a process's ---------------------------------------------

    def process_model(self) -> str | None:
        """The name the process's memory goes by (its current model); None when the
        runtime's memory is not a process's held from start to exit."""
        return None

    def answered(self, classified: Classified, status: int) -> None:
        """The runtime answered a request with `status` (a model switch took effect)."""
        return None

    def process_ended(self) -> None:
        """The process stopped or died: the next one starts as its command says."""
        return None

    def read_unit_command(self, argv: list[str]) -> None:
        """The command line the process's systemd unit runs, as systemd reports it."""
        return None
