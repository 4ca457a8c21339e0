"""The whisper.cpp server (`whisper-server`): a model held from process start to exit.

What decides its parts (reference/runtime-contracts.md §3):

* whisper-server loads its model before it binds its port and frees it only by exiting;
  it has no listing and no unload. Its memory is a process's (PROCESS scope): the gate
  starts it when a request finds it stopped, and evicts it by stopping it.
* `POST /inference` (multipart, streamed up untouched), `GET /health`, `GET /` and
  everything else pass as they are; while they run, the gate counts the process busy.
* `POST /load` (multipart, field `model`: a path on the server) frees the model and loads
  another: a demand for the new model's envelope (`models:` keyed by that path, else the
  consumer's `envelope`). A body without a `model` field, or the model already loaded,
  passes: whisper-server answers it without a new allocation.
* cpp-httplib closes a connection idle for 5 s and after 100 requests, and a POST on a
  connection the server is closing must not be sent again (it may have reached the
  server). The listener reuses a connection only within 2 s of its last answer and for
  at most 100 requests (`keep_alive`, runtimes/keepalive.py), so that race cannot
  arise; the gate's own calls open a connection each (aiohttp's client keeps an idle
  one 15 s: `KeepAlivePolicy.pools_idle`). docs/reliability.md.
* Every response carries `Access-Control-Allow-Origin: *`: there is no origin check to
  run where the gate listens.
"""

from __future__ import annotations

import email.parser
import email.policy

from gpugate.config.model import Consumer
from gpugate.core.tickets import LeaseScope
from gpugate.runtimes.answers import ApiFamily, Classified, RouteKind
from gpugate.runtimes.controlled import ProcessModel, make_control, process_runtime
from gpugate.runtimes.dialect import ServerDialect
from gpugate.runtimes.keepalive import HTTPLIB
from gpugate.runtimes.parts import Reading
from gpugate.runtimes.replies import BodyLimit, whisper_too_large
from gpugate.runtimes.runtime import Runtime

LOAD_BODY_LIMIT = 64 * 1024
"""A /load body is a path; anything longer is not read (whisper-server answers it)."""


def multipart_field(body: bytes, content_type: str, name: str) -> str | None:
    """The text of form field `name` in a multipart/form-data body; None when absent."""
    if not content_type.lower().startswith("multipart/"):
        return None
    head = f"Content-Type: {content_type}\r\nMIME-Version: 1.0\r\n\r\n".encode()
    message = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(head + body)
    if not message.is_multipart():
        return None
    for part in message.iter_parts():
        if part.get_param("name", header="content-disposition") == name:
            payload = part.get_payload(decode=True)
            if isinstance(payload, bytes):
                return payload.decode("utf-8", "replace")
    return None


DEFAULT_MODEL = "models/ggml-base.en.bin"
"""The model whisper-server loads when its command names none (its `-m` default)."""


class WhisperReading(Reading):
    """How one whisper-server reads a request: only a /load may switch its model."""

    keep_alive = HTTPLIB
    dialect = ServerDialect.HTTPLIB
    # cpp-httplib's CPPHTTPLIB_PAYLOAD_MAX_LENGTH is SIZE_MAX and server.cpp sets no
    # payload limit: the gate keeps its own bound, refused as whisper-server refuses.
    body_limit = BodyLimit(None, whisper_too_large)

    def __init__(self, consumer: Consumer, model: ProcessModel) -> None:
        self.consumer = consumer
        self.model = model

    def wants_body(self, method: str, path: str) -> bool:
        return method == "POST" and path == "/load"

    def classify(
        self, method: str, path: str, body: bytes | None, content_type: str, *, query: str = ""
    ) -> Classified:
        if not self.wants_body(method, path) or body is None or len(body) > LOAD_BODY_LIMIT:
            return Classified(RouteKind.PASS, ApiFamily.PLAIN)
        model = multipart_field(body, content_type, "model")
        if not model:
            return Classified(RouteKind.PASS, ApiFamily.PLAIN)
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
    )
