"""vLLM's OpenAI-compatible HTTP side on aiohttp: its routes, its errors, sleep's effect.

What FastAPI/uvicorn add and this app reproduces: an unknown route is 404
`{"detail":"Not Found"}`, a known one with another method 405
`{"detail":"Method Not Allowed"}`, responses carry `server: uvicorn`. vLLM's own errors are
`{"error": {"message", "type", "param", "code"}}` with the status as `code`.

Which routes exist depends on the start: the generation routes for a generating model, only
/v1/embeddings for a pooling one (`build_app` registers them by the model's tasks); /sleep,
/wake_up, /is_sleeping and /collective_rpc only with VLLM_SERVER_DEV_MODE=1.

A request that arrives while the engine sleeps is accepted and waits in the scheduler's
queue (no answer, no error) until every tag is awake again; a request generating when a
sleep in `abort` mode comes ends with finish_reason `abort`.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from http import HTTPStatus
from typing import TextIO

import attrs
from aiohttp import web

from gpugate_sim.vllm import openai
from gpugate_sim.vllm.engine import Engine, WakeFailed
from gpugate_sim.vllm.openai import BadRequest, Generation

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def compact(value: object) -> str:
    """JSON as Starlette and pydantic write it: no blanks after separators."""
    return json.dumps(value, separators=(",", ":"))


def json_response(value: object, status: int = 200) -> web.Response:
    return web.json_response(value, status=status, dumps=compact)


@attrs.frozen
class ServerOptions:
    names: tuple[str, ...]
    model: str
    max_model_len: int
    pooling: bool
    dev_mode: bool
    tokens_per_second: float
    version: str


def error(message: str, err_type: str, status: HTTPStatus, param: str | None = None):
    return json_response(openai.error_body(message, err_type, status.value, param), status.value)


def _detail(status: int, text: str) -> web.Response:
    return json_response({"detail": text}, status)


@web.middleware
async def fastapi_framing(request: web.Request, handler: Handler) -> web.StreamResponse:
    # Starlette's answers for routing failures, not aiohttp's text ones.
    try:
        return await handler(request)
    except web.HTTPMethodNotAllowed:
        return _detail(405, "Method Not Allowed")
    except web.HTTPNotFound:
        return _detail(404, "Not Found")


async def _server_header(request: web.Request, response: web.StreamResponse) -> None:
    response.headers["server"] = "uvicorn"


class VllmServer:
    """The routes of one server process over its `Engine`."""

    def __init__(self, engine: Engine, options: ServerOptions, *, err: TextIO) -> None:
        self.engine = engine
        self.options = options
        self.err = err
        self.created = int(time.time())
        self.app = web.Application(middlewares=[fastapi_framing])
        self.app.on_response_prepare.append(_server_header)
        routes = [
            web.get("/health", self.health),
            web.get("/version", self.version),
            web.get("/v1/models", self.models),
        ]
        if options.pooling:
            routes.append(web.post("/v1/embeddings", self.embeddings))
        else:
            routes += [
                web.post("/v1/chat/completions", self.chat),
                web.post("/v1/completions", self.completions),
            ]
        if options.dev_mode:
            routes += [
                web.post("/sleep", self.sleep),
                web.post("/wake_up", self.wake_up),
                web.get("/is_sleeping", self.is_sleeping),
                web.post("/collective_rpc", self.collective_rpc),
            ]
        self.app.add_routes(routes)

    # -- plain routes --------------------------------------------------------------------

    async def health(self, request: web.Request) -> web.Response:
        # check_health only fails for a dead engine; a sleeping one is healthy.
        return web.Response(status=200)

    async def version(self, request: web.Request) -> web.Response:
        return json_response({"version": self.options.version})

    async def models(self, request: web.Request) -> web.Response:
        o = self.options
        return json_response(openai.model_list(o.names, o.model, o.max_model_len, self.created))

    # -- sleep mode (VLLM_SERVER_DEV_MODE=1) ---------------------------------------------

    async def sleep(self, request: web.Request) -> web.Response:
        text = request.query.get("level", "1")
        try:
            level = int(text)
            await self.engine.sleep(level, request.query.get("mode", "abort"), self.err)
        except ValueError as exc:
            return error(str(exc), "BadRequestError", HTTPStatus.BAD_REQUEST)
        return web.Response(status=200)

    async def wake_up(self, request: web.Request) -> web.Response:
        tags = request.query.getall("tags", []) or None
        self.err.write(f"INFO wake up the engine with tags: {tags}\n")
        try:
            await self.engine.wake_up(tags, self.err)
        except WakeFailed as exc:
            return error(str(exc), "InternalServerError", HTTPStatus.INTERNAL_SERVER_ERROR)
        return web.Response(status=200)

    async def is_sleeping(self, request: web.Request) -> web.Response:
        return json_response({"is_sleeping": self.engine.sleeping})

    async def collective_rpc(self, request: web.Request) -> web.Response:
        try:
            body = await request.json()
        except ValueError:
            return error("Invalid JSON body", "BadRequestError", HTTPStatus.BAD_REQUEST)
        method = body.get("method") if isinstance(body, dict) else None
        if method != "reload_weights":
            message = f"collective_rpc method {method!r} is not simulated"
            return error(message, "BadRequestError", HTTPStatus.BAD_REQUEST)
        try:
            await self.engine.reload_weights()
        except RuntimeError as exc:
            return error(str(exc), "InternalServerError", HTTPStatus.INTERNAL_SERVER_ERROR)
        return json_response({"results": [None]})

    # -- inference -----------------------------------------------------------------------

    async def chat(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=True)

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=False)

    async def _read(self, request: web.Request) -> object:
        try:
            return await request.json()
        except ValueError:
            raise BadRequest("JSON decode error") from None

    def _unknown(self, model: str) -> web.Response | None:
        if model in self.options.names:
            return None
        return error(
            f"The model `{model}` does not exist.",
            "NotFoundError",
            HTTPStatus.NOT_FOUND,
            param="model",
        )

    async def embeddings(self, request: web.Request) -> web.Response:
        try:
            body = openai.embeddings_response(await self._read(request), self.options.names[0])
        except BadRequest as exc:
            return error(str(exc), "BadRequestError", HTTPStatus.BAD_REQUEST)
        refused = self._unknown(body["model"])
        if refused is not None:
            return refused
        await self.engine.scheduling.wait()
        return json_response(body)

    async def _generate(self, request: web.Request, *, chat: bool) -> web.StreamResponse:
        try:
            gen = openai.read_generation(await self._read(request), chat, self.options.names[0])
        except BadRequest as exc:
            return error(str(exc), "BadRequestError", HTTPStatus.BAD_REQUEST)
        refused = self._unknown(gen.model)
        if refused is not None:
            return refused
        # Paused scheduling queues the request: the client just waits.
        await self.engine.scheduling.wait()
        engine = self.engine
        engine.in_flight += 1
        engine.idle.clear()
        try:
            if gen.stream:
                return await self._stream(request, gen)
            rid, created = openai.new_id("chatcmpl" if chat else "cmpl"), int(time.time())
            text, done, finish = "", 0, "stop"
            async for piece, reason in self._tokens(gen):
                text, done = text + piece, done + (1 if piece else 0)
                finish = reason or finish
            return json_response(openai.response(gen, rid, created, text, done, finish))
        finally:
            engine.in_flight -= 1
            if not engine.in_flight:
                engine.idle.set()

    async def _tokens(self, gen: Generation) -> AsyncIterator[tuple[str, str | None]]:
        """(text, finish) per generated token; the last one carries the finish reason."""
        engine = self.engine
        aborts = engine.aborts
        count, finish = openai.planned_tokens(gen)
        for index in range(count):
            await asyncio.sleep(1 / self.options.tokens_per_second)
            while engine.frozen:
                await engine.scheduling.wait()
            if engine.aborts != aborts:
                yield "", "abort"
                return
            piece = openai.token_text(index, garbage=not engine.weights_valid)
            yield piece, finish if index == count - 1 else None

    async def _stream(self, request: web.Request, gen: Generation) -> web.StreamResponse:
        rid = openai.new_id("chatcmpl" if gen.chat else "cmpl")
        created = int(time.time())
        response = web.StreamResponse(headers={"content-type": "text/event-stream; charset=utf-8"})
        await response.prepare(request)
        if gen.chat:
            await response.write(openai.sse(openai.role_chunk(gen, rid, created)))
        done = 0
        async for piece, finish in self._tokens(gen):
            done += 1 if piece else 0
            await response.write(openai.sse(openai.chunk(gen, rid, created, piece, finish)))
        if gen.include_usage:
            await response.write(openai.sse(openai.usage_chunk(gen, rid, created, done)))
        await response.write(openai.sse("[DONE]"))
        await response.write_eof()
        return response
