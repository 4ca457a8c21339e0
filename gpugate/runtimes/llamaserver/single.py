"""llama-server with one model (`-m FILE`): a process that loads its model before it serves
and holds it until it exits, fronted as whisper-server is (runtimes/controlled.py).

The gate starts it when a request that runs the model finds it stopped, and evicts it by
stopping it. While its model loads it answers 503 "Loading model" on every route but its
web UI's files (server-http.cpp middleware_server_state); the gate's start waits for
`GET /health` to answer 200 first.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

import aiohttp

from gpugate.config.model import Consumer
from gpugate.runtimes.base import ApiFamily, Classified, RouteKind, Screening
from gpugate.runtimes.controlled import ProcessAdapter
from gpugate.runtimes.dialect import ServerDialect
from gpugate.runtimes.keepalive import HTTPLIB, KeepAlivePolicy
from gpugate.runtimes.llamaserver.reading import is_proxied
from gpugate.runtimes.llamaserver.replies import LLAMA_BODY_LIMIT, llama_screening
from gpugate.runtimes.replies import ErrorReply


class LlamaSingleAdapter(ProcessAdapter):
    """One single-model llama-server the gate starts and stops."""

    # cpp-httplib's keep-alive, as the router's (router.py).
    pool_connections: ClassVar[bool] = False
    keep_alive: ClassVar[KeepAlivePolicy] = HTTPLIB
    dialect: ClassVar[ServerDialect] = ServerDialect.HTTPLIB
    body_limit = LLAMA_BODY_LIMIT

    def __init__(self, consumer: Consumer) -> None:
        super().__init__(consumer)

    def start_model(self) -> str:
        return self.commanded_model("-m", "--model") or super().start_model()

    def screen(self, method: str, headers: Mapping[str, str], *, target: str = "") -> Screening:
        return llama_screening(headers)

    def wants_body(self, method: str, path: str) -> bool:
        return False

    def needs_process(self, method: str, path: str) -> bool:
        # The routes that run the model; /health, /props, /v1/models and the UI do not.
        return is_proxied(method, path) and method == "POST"

    def classify(
        self, method: str, path: str, body: bytes | None, content_type: str, *, query: str = ""
    ) -> Classified:
        return Classified(RouteKind.PASS, ApiFamily.LLAMA)

    def up_health(self, method: str = "GET") -> ErrorReply:
        # Its `/health` once the model is loaded (docs/runtimes/llamaserver.md), in the
        # content type of its JSON answers (the gate's llama error shape, answers.py).
        return ErrorReply(200, b'{"status":"ok"}', "application/json; charset=utf-8")

    async def health(self, session: aiohttp.ClientSession) -> bool:
        """`GET /health` answers 200 once the model is loaded (503 while it loads)."""
        path = self.consumer.control.health if self.consumer.control is not None else "/health"
        async with session.get(self.url(path)) as resp:
            await resp.read()
            return resp.status == 200
