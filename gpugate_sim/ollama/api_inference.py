"""/api/generate, /api/chat, /api/embed and /api/embeddings: the routes that load models."""

from __future__ import annotations

from aiohttp import web

from gpugate_sim.ollama.afterload import format_refusal, generate_refusal
from gpugate_sim.ollama.binding import BindError, bind, text_field
from gpugate_sim.ollama.catalog import Capability, CatalogModel
from gpugate_sim.ollama.engine import DoneReason, Finished
from gpugate_sim.ollama.gofold import go_quote
from gpugate_sim.ollama.names import go_trim_space
from gpugate_sim.ollama.options import OptionError, RequestOptions, parse_options
from gpugate_sim.ollama.record import Reading, reading
from gpugate_sim.ollama.relay import relay
from gpugate_sim.ollama.requests import CHAT, EMBED, EMBEDDINGS, GENERATE
from gpugate_sim.ollama.runnerref import Lease, ScheduleError
from gpugate_sim.ollama.services import Services, bind_message, keep_alive_of, services
from gpugate_sim.ollama.wire import (
    NDJSON,
    api_error,
    json_response,
    ndjson_line,
    now_ns,
    rfc3339,
    stream_write,
)


def options_of(body: dict[str, object]) -> dict[str, object] | None:
    """The bound `options` object (binding has checked it is an object or absent)."""
    options = body.get("options")
    return options if isinstance(options, dict) else None


def metrics(finished: Finished, started_ns: int, load_ns: int) -> dict[str, object]:
    return {
        "total_duration": max(1, now_ns() - started_ns),
        "load_duration": max(1, load_ns),
        "prompt_eval_count": finished.prompt_eval_count,
        "prompt_eval_duration": finished.prompt_eval_ns,
        "eval_count": finished.eval_count,
        "eval_duration": finished.eval_ns,
    }


class Completion:
    """One /api/generate or /api/chat answer, streamed as NDJSON or collected."""

    content_type = NDJSON

    def __init__(self, svc: Services, name: str, chat: bool, stream: bool) -> None:
        self.svc = svc
        self.name = name
        self.chat = chat
        self.stream = stream
        self.started_ns = now_ns()
        self.load_ns = 0
        """The lease's load time, once `run` has it."""

    def chunk(self, text: str) -> dict[str, object]:
        head: dict[str, object] = {"model": self.name, "created_at": rfc3339(now_ns())}
        if self.chat:
            return {**head, "message": {"role": "assistant", "content": text}, "done": False}
        return {**head, "response": text, "done": False}

    def final(self, text: str, reason: DoneReason, extra: dict[str, object]) -> dict[str, object]:
        head: dict[str, object] = {"model": self.name, "created_at": rfc3339(now_ns())}
        if self.chat:
            message = {"role": "assistant", "content": text}
            return {**head, "message": message, "done_reason": reason.value, "done": True, **extra}
        return {**head, "response": text, "done": True, "done_reason": reason.value, **extra}

    def _extra(self, done: Finished) -> dict[str, object]:
        extra = metrics(done, self.started_ns, self.load_ns)
        return extra if self.chat else {"context": list(done.context), **extra}

    # -- as relay.Answer --------------------------------------------------------------

    def token(self, text: str) -> bytes:
        return ndjson_line(self.chunk(text))

    def whole(self, text: str, done: Finished) -> web.Response:
        return json_response(self.final(text, done.done_reason, self._extra(done)))

    async def end(
        self, request: web.Request, response: web.StreamResponse | None, done: Finished
    ) -> web.StreamResponse:
        last = ndjson_line(self.final("", done.done_reason, self._extra(done)))
        return await stream_write(request, response, NDJSON, last)

    def refused(self, message: str) -> web.Response:
        return api_error(500, message)

    def broken(self, message: str) -> bytes:
        return ndjson_line({"error": message})

    async def run(
        self, request: web.Request, lease: Lease, prompt: str, options: RequestOptions
    ) -> web.StreamResponse:
        self.load_ns = lease.load_ns
        return await relay(request, self.svc.engine.complete(lease, prompt, options), self)


async def _schedule(
    svc: Services,
    read: Reading,
    model: CatalogModel,
    body: dict[str, object],
    keep_alive: int | None,
) -> tuple[Lease, RequestOptions] | web.Response:
    """The request's options and its runner, or Ollama's answer when it has neither: its
    options parsed (an invalid one is GenerateHandler's 500), then scheduled."""
    try:
        options = parse_options(model, options_of(body))
    except OptionError as exc:
        return api_error(500, str(exc))
    loading = read.loading(model, keep_alive, options_of(body))
    try:
        return await svc.scheduler.acquire(loading, options, keep_alive), options
    except ScheduleError as exc:
        return api_error(exc.status, exc.message)


async def generate(request: web.Request) -> web.StreamResponse:
    svc = services(request)
    read = reading(request)
    try:
        body = bind(await request.read(), GENERATE)
    except BindError as exc:
        read.malformed = True
        return api_error(400, bind_message(exc))
    keep_alive = keep_alive_of(body)
    if not _top_logprobs_ok(body):
        return api_error(400, "top_logprobs must be between 0 and 20")
    name = text_field(body, "model")
    model = svc.catalog.lookup(name)
    if model is None:
        return api_error(404, f"model '{name}' not found")
    prompt = text_field(body, "prompt")
    if prompt == "" and keep_alive == 0:
        svc.scheduler.expire(model)
        head = {"model": name, "created_at": rfc3339(now_ns()), "response": ""}
        return json_response({**head, "done": True, "done_reason": "unload"})
    raw = body.get("raw") is True
    if raw and (text_field(body, "template") or text_field(body, "system") or body.get("context")):
        return api_error(400, "raw mode does not support template, system, or context")
    if body.get("think") not in (None, False):
        return api_error(400, f"{go_quote(name)} does not support thinking")
    if Capability.COMPLETION not in model.capabilities:
        return api_error(400, f"{go_quote(name)} does not support generate")
    if text_field(body, "suffix"):
        # scheduleRunner's CheckCapabilities: no simulated model can insert
        return api_error(400, f"{model.name.full} does not support insert")
    completion = Completion(svc, name, chat=False, stream=body.get("stream") is not False)
    scheduled = await _schedule(svc, read, model, body, keep_alive)
    if isinstance(scheduled, web.Response):
        return scheduled
    lease, options = scheduled
    try:
        if prompt == "":
            head = {"model": name, "created_at": rfc3339(now_ns()), "response": ""}
            return json_response({**head, "done": True, "done_reason": "load"})
        refused = generate_refusal(body, raw)
        if refused is not None:
            read.after_load = refused.message
            return refused.answer(completion.stream)
        return await completion.run(request, lease, prompt, options)
    finally:
        svc.scheduler.release(lease)


def _top_logprobs_ok(body: dict[str, object]) -> bool:
    """routes.go:206 and :2190, before the model is even looked up."""
    value = body.get("top_logprobs", 0)
    return not isinstance(value, int) or 0 <= value <= 20


def chat_prompt(messages: list[object]) -> str:
    """The text the model sees; BindError when a message content is not a string."""
    lines = []
    for message in messages:
        if not isinstance(message, dict):
            continue
        content = message.get("content")
        if content is not None and not isinstance(content, str):
            kind = "array" if isinstance(content, list) else type(content).__name__
            kind = {"dict": "object", "int": "number", "float": "number"}.get(kind, kind)
            raise BindError(
                f"json: cannot unmarshal {kind} into Go struct field "
                "ChatRequest.messages.content of type string"
            )
        lines.append(f"{message.get('role', '')}: {content or ''}")
    return "\n".join(lines)


async def chat(request: web.Request) -> web.StreamResponse:
    svc = services(request)
    read = reading(request)
    try:
        body = bind(await request.read(), CHAT)
        messages = body.get("messages") or []
        assert isinstance(messages, list)
        prompt = chat_prompt(messages)
    except BindError as exc:
        read.malformed = True
        return api_error(400, bind_message(exc))
    keep_alive = keep_alive_of(body)
    if not _top_logprobs_ok(body):
        return api_error(400, "top_logprobs must be between 0 and 20")
    name = text_field(body, "model")
    if not go_trim_space(name):
        return api_error(400, "model is required")
    model = svc.catalog.lookup(name)
    if model is None:
        return api_error(404, f"model '{name}' not found")
    if not messages and keep_alive == 0:
        svc.scheduler.expire(model)
        head = {"model": name, "created_at": rfc3339(now_ns())}
        message = {"role": "assistant", "content": ""}
        return json_response({**head, "message": message, "done_reason": "unload", "done": True})
    if body.get("think") not in (None, False):
        return api_error(400, f"{go_quote(name)} does not support thinking")
    if Capability.COMPLETION not in model.capabilities:
        return api_error(400, f"{go_quote(name)} does not support chat")
    if body.get("tools"):
        # scheduleRunner's CheckCapabilities: no simulated model calls tools
        return api_error(400, f"{model.name.full} does not support tools")
    completion = Completion(svc, name, chat=True, stream=body.get("stream") is not False)
    scheduled = await _schedule(svc, read, model, body, keep_alive)
    if isinstance(scheduled, web.Response):
        return scheduled
    lease, options = scheduled
    try:
        if not messages:
            head = {"model": name, "created_at": rfc3339(now_ns())}
            message = {"role": "assistant", "content": ""}
            return json_response({**head, "message": message, "done_reason": "load", "done": True})
        refused = format_refusal(body)
        if refused is not None:
            read.after_load = refused.message
            return refused.answer(completion.stream)
        return await completion.run(request, lease, prompt, options)
    finally:
        svc.scheduler.release(lease)


def _embed_inputs(value: object) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return [value] if value else []
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return list(value)
    raise BindError("invalid input type")


async def embed(request: web.Request) -> web.StreamResponse:
    svc = services(request)
    read = reading(request)
    started = now_ns()
    try:
        body = bind(await request.read(), EMBED)
    except BindError as exc:
        read.malformed = True
        return api_error(400, bind_message(exc))
    keep_alive = keep_alive_of(body)
    name = text_field(body, "model")
    if not go_trim_space(name):
        return api_error(404, f"model '{name}' not found")
    try:
        inputs = _embed_inputs(body.get("input"))
    except BindError as exc:
        return api_error(400, str(exc))
    model = svc.catalog.lookup(name)
    if model is None:
        return api_error(404, f"model {go_quote(name)} not found, try pulling it first")
    scheduled = await _schedule(svc, read, model, body, keep_alive)
    if isinstance(scheduled, web.Response):
        return scheduled
    lease, _ = scheduled
    try:
        if not inputs:
            return json_response({"model": name, "embeddings": []})
        vectors, tokens = await svc.engine.embed(lease, inputs)
        dimensions = body.get("dimensions")
        if isinstance(dimensions, int) and 0 < dimensions < len(vectors[0]):
            vectors = [_renormalise(v[:dimensions]) for v in vectors]
        return json_response(
            {
                "model": name,
                "embeddings": vectors,
                "total_duration": max(1, now_ns() - started),
                "load_duration": max(1, lease.load_ns),
                "prompt_eval_count": tokens,
            }
        )
    finally:
        svc.scheduler.release(lease)


def _renormalise(vector: list[float]) -> list[float]:
    norm = sum(v * v for v in vector) ** 0.5 or 1.0
    return [round(v / norm, 6) for v in vector]


async def embeddings(request: web.Request) -> web.StreamResponse:
    svc = services(request)
    read = reading(request)
    try:
        body = bind(await request.read(), EMBEDDINGS)
    except BindError as exc:
        read.malformed = True
        return api_error(400, bind_message(exc))
    keep_alive = keep_alive_of(body)
    name = text_field(body, "model")
    if not go_trim_space(name):
        return api_error(400, "model is required")
    model = svc.catalog.lookup(name, fold=False)
    if model is None:
        return api_error(404, f"model {go_quote(name)} not found, try pulling it first")
    scheduled = await _schedule(svc, read, model, body, keep_alive)
    if isinstance(scheduled, web.Response):
        return scheduled
    lease, _ = scheduled
    try:
        prompt = text_field(body, "prompt")
        if not prompt:
            return json_response({"embedding": []})
        vectors, _ = await svc.engine.embed(lease, [prompt])
        return json_response({"embedding": vectors[0]})
    finally:
        svc.scheduler.release(lease)
