"""The whisper.cpp server (`whisper-server`): a model held from process start to exit.

What decides its parts (reference/runtime-contracts.md §3, docs/runtimes/whisper.md):

* whisper-server loads its model before it binds its port and frees it only by exiting;
  it has no listing and no unload. Its memory is a process's (PROCESS scope): the gate
  starts it when a request finds it stopped, and evicts it by stopping it.
* `POST /inference` (multipart, streamed up untouched), `GET /health`, `GET /` and
  everything else pass as they are; while they run, the gate counts the process busy.
* `POST /load` (multipart, field `model`: a path on the server) frees the model and loads
  another: a demand for the new model's envelope (`models:` keyed by that path, else the
  consumer's `envelope`). Its body is read whatever its size, up to the gate's own bound
  (past it: refused in whisper-server's shape, never passed), and read as cpp-httplib
  reads it (form.py). A body without a `model` part, or one cpp-httplib refuses, passes:
  whisper-server answers it without a new allocation. One whose reading depends on where
  cpp-httplib's socket reads split it, or that names two different models, is refused as
  whisper-server refuses a form it cannot read (400 `Invalid request`).
* The route is cpp-httplib's: server.cpp registers `--request-path` + `/load` as a regular
  expression (`make_matcher`, httplib.h L6308) matched against the percent-decoded path
  (`parse_request_line` L6605, `%uXXXX` included). A POST that route matches but the
  gate's own reading of the path does not, or one with differing `Content-Type` headers
  (cpp-httplib reads the last, the listener the first), is refused the same way.
* Every request goes up on a connection of its own and says `Connection: close`
  (`keep_alive`: cpp-httplib's numbers, Nagle's algorithm on, no reuse). cpp-httplib
  stops reading a body it refuses (an encoded one: 415 before a byte of it; a form whose
  parser gives up: 400 at that read) and answers at once; on a kept-alive connection
  it then reads what is left of that body as the next request
  (`process_server_socket_core` L3445: a new `SocketStream` each time), so an
  /inference the gate streams up unread could carry a /load it never saw. With
  `Connection: close` the server ends the connection after its answer (L7274). The
  gate's own calls open a connection each too (`KeepAlivePolicy.pools_idle`). A new
  connection is also the quick one: whisper-server leaves Nagle on and writes an answer's
  head and body apart, so on a reused connection each answer waits 40 ms for the client's
  delayed ACK (keepalive.py `HTTPLIB_NAGLE`). A client the gate keeps is told what
  whisper-server would tell it (`Keep-Alive: timeout=5, max=100`).
* Every response carries `Server: whisper.cpp` and `Access-Control-Allow-Origin: *`
  (`set_default_headers`): there is no origin check to run where the gate listens, and
  the gate's own answers in its place (a refused /load, its health route while the gate
  keeps it stopped: `up_health`) carry the same headers.
* A /load took effect when, and only when, it was answered 200 (`loaded_by`): the gate
  then counts the switch done, and the process's current model follows.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping

import attrs
from yarl import URL

from gpugate.config.model import Consumer
from gpugate.core.tickets import LeaseScope
from gpugate.runtimes.answers import ApiFamily, Classified, Refusal, RouteKind, Screening
from gpugate.runtimes.controlled import ProcessModel, make_control, process_runtime
from gpugate.runtimes.dialect import ServerDialect
from gpugate.runtimes.keepalive import HTTPLIB_NAGLE
from gpugate.runtimes.parts import Reading
from gpugate.runtimes.replies import (
    WHISPER_DEFAULT_HEADERS,
    BodyLimit,
    ErrorReply,
    whisper_too_large,
)
from gpugate.runtimes.runtime import Runtime
from gpugate.runtimes.whisper.form import boundary_of, decode_url, path_of, read_form

UNREADABLE = ErrorReply(400, b"Invalid request", "text/plain", headers=WHISPER_DEFAULT_HEADERS)
"""whisper-server's answer to a form cpp-httplib refuses: its error handler's 400 body."""

DEFAULT_MODEL = "models/ggml-base.en.bin"
"""The model whisper-server loads when its command names none (its `-m` default)."""


@functools.lru_cache(maxsize=8)
def load_route(request_path: str) -> re.Pattern[str]:
    """server.cpp's `svr->Post(request_path + "/load")`: a regular expression, matched whole."""
    try:
        return re.compile(request_path + "/load")
    except re.error:
        return re.compile(re.escape(request_path + "/load"))


def httplib_path(target: str) -> str:
    """The path cpp-httplib routes on: the target before `#` and `?`, percent-decoded."""
    raw = target.split("#", 1)[0].split("?", 1)[0]
    return decode_url(raw.encode("utf-8", "surrogateescape")).decode("utf-8", "surrogateescape")


def header_value(value: str) -> bytes:
    """A header value as cpp-httplib keeps it: trimmed of spaces and tabs, percent-decoded."""
    return decode_url(value.encode("utf-8", "surrogateescape").strip(b" \t"))


class WhisperReading(Reading):
    """How one whisper-server reads a request: only a /load may switch its model."""

    keep_alive = attrs.evolve(HTTPLIB_NAGLE, reuse=False)
    dialect = ServerDialect.HTTPLIB_0_20
    # cpp-httplib's CPPHTTPLIB_PAYLOAD_MAX_LENGTH is SIZE_MAX and server.cpp sets no
    # payload limit: the gate keeps its own bound, refused as whisper-server refuses.
    body_limit = BodyLimit(None, whisper_too_large)

    def __init__(self, consumer: Consumer, model: ProcessModel) -> None:
        self.consumer = consumer
        self.model = model

    def _route(self) -> re.Pattern[str]:
        return load_route(self.model.commanded_model("--request-path") or "")

    def wants_body(self, method: str, path: str) -> bool:
        return method == "POST" and self._route().fullmatch(path) is not None

    def screen(self, method: str, headers: Mapping[str, str], *, target: str = "") -> Screening:
        """A POST to /load that the gate could read otherwise than cpp-httplib: its route
        only cpp-httplib's decoding finds, or Content-Type headers that differ."""
        if method != "POST":
            return Screening()
        route = self._route()
        try:
            url = URL(target, encoded=True)
        except ValueError:
            url = URL("/")
        # An absolute-form target goes up in origin form (proxy/forward.py `request_head`).
        forwarded = target if target.startswith("/") or not url.absolute else str(url.relative())
        theirs = route.fullmatch(httplib_path(forwarded)) is not None
        ours = route.fullmatch(url.path) is not None
        if theirs and not ours:
            return Screening(reply=UNREADABLE)
        getall = getattr(headers, "getall", None)
        types = getall("Content-Type", []) if getall is not None else []
        if (theirs or ours) and len(set(types)) > 1:
            return Screening(reply=UNREADABLE)
        return Screening()

    def classify(
        self, method: str, path: str, body: bytes | None, content_type: str, *, query: str = ""
    ) -> Classified:
        if not self.wants_body(method, path) or body is None:
            return Classified(RouteKind.PASS, ApiFamily.PLAIN)
        boundary = boundary_of(header_value(content_type))
        if not boundary:
            return Classified(RouteKind.PASS, ApiFamily.PLAIN)  # no parts: no model
        reading = read_form(body, boundary)
        models = {path_of(part.content) for part in reading.named(b"model")} - {b""}
        if reading.doubt is not None or len(models) > 1:
            refusal = Refusal(400, "Invalid request", exact=UNREADABLE)
            return Classified(RouteKind.REFUSE, ApiFamily.PLAIN, refusal=refusal)
        if not models:
            return Classified(RouteKind.PASS, ApiFamily.PLAIN)
        model = models.pop().decode("utf-8", "surrogateescape")
        # Even the model it runs now: whisper-server frees it and loads it again, and a
        # /load ahead of this one in its queue may have switched it by the time this one
        # runs (the model named at arrival says nothing about the model then).
        control = self.consumer.control
        return Classified(
            RouteKind.DEMAND,
            ApiFamily.PLAIN,
            model,
            scope=LeaseScope.PROCESS,
            appear_within=control.start_admission_timeout if control is not None else None,
            # whisper_free of the running model comes before the new one's load.
            replaces=self.model.current,
        )

    def loaded_by(self, classified: Classified, status: int) -> bool:
        """A /load took effect only with its 200 `Load was successful!`: server.cpp's
        handler answers every refusal 400 (no `model`, a path that does not open) and,
        for a file that opens but does not load, exits without an answer; cpp-httplib
        sends no other final status for it."""
        return status == 200


def up_health(method: str) -> ErrorReply:
    """whisper-server's `GET /health` once its model is loaded, as it sends it: 200
    `{"status":"ok"}`, `application/json` (server.cpp's `/health` handler) with the
    headers `set_default_headers` puts on every answer; to a HEAD, cpp-httplib adds
    `Accept-Ranges: bytes` (httplib.h L6664) and no body."""
    headers = WHISPER_DEFAULT_HEADERS
    if method == "HEAD":
        headers = (("Accept-Ranges", "bytes"), *headers)
    return ErrorReply(200, b'{"status":"ok"}', "application/json", headers=headers)


def needs_process(method: str, path: str) -> bool:
    """Its only POST routes are the inference path and /load; GET /health, the page and
    anything else neither start it nor keep it warm."""
    return method == "POST"


def whisper_runtime(consumer: Consumer) -> Runtime:
    """One whisper-server behind the gate: its health route is `GET /health` (200; 503
    while a /load runs)."""
    model = ProcessModel(consumer, options=("-m", "--model"), default=DEFAULT_MODEL)
    control = consumer.control
    return process_runtime(
        consumer,
        WhisperReading(consumer, model),
        model,
        control=make_control(consumer),
        health_path=control.health if control is not None else "/health",
        needs_process=needs_process,
        up_health=up_health,
    )
