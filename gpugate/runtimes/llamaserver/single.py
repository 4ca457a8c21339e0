"""llama-server with one model (`-m FILE`): a process that loads its model before it serves
and holds it until it exits, fronted as whisper-server is (runtimes/controlled.py).

The gate starts it when a request that runs the model finds it stopped, and evicts it by
stopping it. While its model loads it answers 503 "Loading model" on every route but its
web UI's files (server-http.cpp middleware_server_state); the gate's start waits for
`GET /health` to answer 200 first.
"""

from __future__ import annotations

from collections.abc import Mapping

from gpugate.config.model import Consumer
from gpugate.runtimes.answers import ApiFamily, Classified, RouteKind, Screening
from gpugate.runtimes.controlled import ProcessModel, make_control, process_runtime
from gpugate.runtimes.dialect import ServerDialect
from gpugate.runtimes.keepalive import LLAMA_HTTPLIB
from gpugate.runtimes.llamaserver.memory import SingleMemory
from gpugate.runtimes.llamaserver.reading import is_proxied
from gpugate.runtimes.llamaserver.replies import LLAMA_BODY_LIMIT, llama_screening
from gpugate.runtimes.parts import Reading
from gpugate.runtimes.replies import ErrorReply
from gpugate.runtimes.runtime import Runtime

UP_HEALTH = ErrorReply(200, b'{"status":"ok"}', "application/json; charset=utf-8")
"""Its `/health` once the model is loaded (docs/runtimes/llamaserver.md), in the content
type of its JSON answers (the gate's llama error shape, answers.py)."""


class LlamaSingleReading(Reading):
    """One single-model llama-server: its requests pass; its answers are cpp-httplib's."""

    # cpp-httplib's keep-alive, as the router's (router.py).
    keep_alive = LLAMA_HTTPLIB
    dialect = ServerDialect.HTTPLIB
    body_limit = LLAMA_BODY_LIMIT

    def screen(self, method: str, headers: Mapping[str, str], *, target: str = "") -> Screening:
        return llama_screening(headers)

    def wants_body(self, method: str, path: str) -> bool:
        return False

    def classify(
        self, method: str, path: str, body: bytes | None, content_type: str, *, query: str = ""
    ) -> Classified:
        return Classified(RouteKind.PASS, ApiFamily.LLAMA)


def needs_process(method: str, path: str) -> bool:
    """The routes that run the model; /health, /props, /v1/models and the UI do not."""
    return is_proxied(method, path) and method == "POST"


def single_runtime(consumer: Consumer) -> Runtime:
    """One single-model llama-server the gate starts and stops: `GET /health` answers 200
    once the model is loaded (503 while it loads)."""
    model = ProcessModel(consumer, options=("-m", "--model"))
    control = consumer.control
    return process_runtime(
        consumer,
        LlamaSingleReading(),
        model,
        control=make_control(consumer),
        health_path=control.health if control is not None else "/health",
        needs_process=needs_process,
        up_health=UP_HEALTH,
        memory=lambda settings: SingleMemory(settings, model.commanded_model),
    )
