"""The OpenAI-compatible routes (/v1/*), as Ollama's middleware translates them.

These routes cannot carry keep_alive or runner options: Ollama's request structs have no
such fields, so a /v1 request loads with the server default keep_alive and the model's
default options, and leaves a loaded runner's keep_alive untouched. The one extension
is for tests: a top-level `options` object may carry the simulation's `sim_*` keys.
"""

from __future__ import annotations

import base64
import random
import struct
import time

from aiohttp import web

from gpugate_sim.ollama.binding import BindError, bind, exact_member, text_field
from gpugate_sim.ollama.catalog import Capability, CatalogModel
from gpugate_sim.ollama.engine import DoneReason, Finished
from gpugate_sim.ollama.gofold import go_quote
from gpugate_sim.ollama.names import ModelRef, go_trim_space
from gpugate_sim.ollama.openai_convert import asks_to_think, chat_prompt, completion_stop
from gpugate_sim.ollama.options import OptionError, RequestOptions, parse_options
from gpugate_sim.ollama.record import reading
from gpugate_sim.ollama.relay import relay
from gpugate_sim.ollama.requests import CHAT_COMPLETION, COMPLETION, EMBEDDING
from gpugate_sim.ollama.runnerref import Lease, ScheduleError
from gpugate_sim.ollama.services import Services, services
from gpugate_sim.ollama.wire import (
    EVENT_STREAM,
    SSE_DONE,
    encoder_response,
    openai_error,
    sse_event,
    stream_write,
)

FINGERPRINT = "fp_ollama"


def cloud_passthrough(body: bytes) -> str | None:
    """cloudPassthroughMiddleware (server/cloud_proxy.go), before any /v1 middleware reads
    the body: the exact key "model" of the whole body, a string naming a cloud model. Ollama
    proxies such a request to its cloud unread; here it is the unknown model's 404."""
    model = exact_member(body, "model")
    if not isinstance(model, str) or not go_trim_space(model):
        return None
    ref = ModelRef.parse(model)
    return model if ref is not None and ref.source == "cloud" else None


def _sim_options(model: CatalogModel, body: dict[str, object]) -> RequestOptions:
    raw = body.get("options")
    sim = {k: v for k, v in raw.items() if k.startswith("sim_")} if isinstance(raw, dict) else {}
    max_tokens = body.get("max_tokens")
    if type(max_tokens) is int:  # a field of the chat and completion requests (*int)
        sim["num_predict"] = max_tokens
    return parse_options(model, sim, runner_options=False)


def _usage(finished: Finished) -> dict[str, int]:
    return {
        "prompt_tokens": finished.prompt_eval_count,
        "completion_tokens": finished.eval_count,
        "total_tokens": finished.prompt_eval_count + finished.eval_count,
    }


class OpenAICompletion:
    """One /v1/chat/completions or /v1/completions answer, as SSE or one JSON object."""

    content_type = EVENT_STREAM

    def __init__(self, name: str, chat: bool, stream: bool, include_usage: bool) -> None:
        self.name = name
        self.chat = chat
        self.stream = stream
        self.include_usage = include_usage
        prefix = "chatcmpl" if chat else "cmpl"
        self.id = f"{prefix}-{random.randrange(999)}"
        self.created = int(time.time())

    def chunk(self, text: str, reason: str | None) -> dict[str, object]:
        if self.chat:
            choice = {
                "index": 0,
                "delta": {"role": "assistant", "content": text},
                "finish_reason": reason,
            }
            return self._envelope("chat.completion.chunk", [choice])
        choice = {"text": text, "index": 0, "finish_reason": reason}
        body = self._envelope("text_completion", [choice], choices_first=True)
        if self.include_usage:
            body["usage"] = {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}
        return body

    def _envelope(
        self, kind: str, choices: list[object], *, choices_first: bool = False
    ) -> dict[str, object]:
        if choices_first:
            return {
                "id": self.id,
                "object": kind,
                "created": self.created,
                "choices": choices,
                "model": self.name,
                "system_fingerprint": FINGERPRINT,
            }
        return {
            "id": self.id,
            "object": kind,
            "created": self.created,
            "model": self.name,
            "system_fingerprint": FINGERPRINT,
            "choices": choices,
        }

    def body(self, text: str, reason: str, usage: dict[str, int]) -> dict[str, object]:
        """The whole answer, not streamed."""
        if self.chat:
            choice: dict[str, object] = {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "finish_reason": reason,
            }
            body = self._envelope("chat.completion", [choice])
        else:
            choice = {"text": text, "index": 0, "finish_reason": reason}
            body = self._envelope("text_completion", [choice])
        return {**body, "usage": usage}

    # -- as relay.Answer --------------------------------------------------------------

    def token(self, text: str) -> bytes:
        return sse_event(self.chunk(text, None))

    def whole(self, text: str, done: Finished) -> web.Response:
        return encoder_response(self.body(text, done.done_reason.value, _usage(done)))

    async def end(
        self, request: web.Request, response: web.StreamResponse | None, done: Finished
    ) -> web.StreamResponse:
        return await self.finish(request, response, done.done_reason.value, _usage(done))

    def refused(self, message: str) -> web.Response:
        return openai_error(500, message)

    def broken(self, message: str) -> bytes:
        # Ollama's SSE writer decodes the error line as an empty response: one chunk with
        # an empty delta, and the stream ends without [DONE].
        return sse_event(self.chunk("", None))

    async def run(
        self, svc: Services, request: web.Request, lease: Lease, prompt: str, opts: RequestOptions
    ) -> web.StreamResponse:
        return await relay(request, svc.engine.complete(lease, prompt, opts), self)

    async def finish(
        self,
        request: web.Request,
        response: web.StreamResponse | None,
        reason: str,
        usage: dict[str, int],
    ) -> web.StreamResponse:
        """The closing chunk, the usage chunk when asked for, and [DONE]."""
        last = self.chunk("", reason)
        response = await stream_write(request, response, EVENT_STREAM, sse_event(last))
        if self.include_usage:
            await response.write(sse_event({**last, "choices": [], "usage": usage}))
        await response.write(SSE_DONE)
        return response


async def _lease(svc: Services, model: CatalogModel, opts: RequestOptions) -> Lease | web.Response:
    try:
        return await svc.scheduler.acquire(model, opts, None)
    except ScheduleError as exc:
        return openai_error(exc.status, exc.message)


def _stream_flags(body: dict[str, object]) -> tuple[bool, bool]:
    options = body.get("stream_options")
    usage = isinstance(options, dict) and options.get("include_usage") is True
    return body.get("stream") is True, usage


async def chat_completions(request: web.Request) -> web.StreamResponse:
    svc = services(request)
    read = reading(request)
    data = await request.read()
    cloud = cloud_passthrough(data)
    if cloud is not None:
        return openai_error(404, f"model '{cloud}' not found")
    try:
        body = bind(data, CHAT_COMPLETION)
    except BindError as exc:
        read.malformed = True
        return openai_error(400, str(exc))
    messages = body.get("messages") or []
    assert isinstance(messages, list)
    if not messages:
        return openai_error(400, "[] is too short - 'messages'")
    try:
        prompt = chat_prompt(body)
    except BindError as exc:
        return openai_error(400, str(exc))
    top_logprobs = body.get("top_logprobs", 0)
    if isinstance(top_logprobs, int) and not 0 <= top_logprobs <= 20:
        return openai_error(400, "top_logprobs must be between 0 and 20")
    name = text_field(body, "model")
    if not go_trim_space(name):
        return openai_error(400, "model is required")
    model = svc.catalog.lookup(name)
    if model is None:
        return openai_error(404, f"model '{name}' not found")
    if asks_to_think(body):
        return openai_error(400, f"{go_quote(name)} does not support thinking")
    if Capability.COMPLETION not in model.capabilities:
        return openai_error(400, f"{go_quote(name)} does not support chat")
    if body.get("tools"):
        return openai_error(400, f"{model.name.full} does not support tools")
    try:
        opts = _sim_options(model, body)
    except OptionError as exc:
        return openai_error(500, str(exc))
    stream, usage = _stream_flags(body)
    lease = await _lease(svc, read.loading(model, None, None), opts)
    if isinstance(lease, web.Response):
        return lease
    try:
        answer = OpenAICompletion(name, chat=True, stream=stream, include_usage=usage)
        return await answer.run(svc, request, lease, prompt, opts)
    finally:
        svc.scheduler.release(lease)


async def completions(request: web.Request) -> web.StreamResponse:
    svc = services(request)
    read = reading(request)
    data = await request.read()
    cloud = cloud_passthrough(data)
    if cloud is not None:
        return openai_error(404, f"model '{cloud}' not found")
    try:
        body = bind(data, COMPLETION)
    except BindError as exc:
        read.malformed = True
        return openai_error(400, str(exc))
    try:
        completion_stop(body)
    except BindError as exc:
        return openai_error(400, str(exc))
    logprobs = body.get("logprobs")
    if isinstance(logprobs, int) and logprobs > 20:
        # CompletionsMiddleware makes it GenerateRequest.TopLogprobs, checked first
        return openai_error(400, "top_logprobs must be between 0 and 20")
    name = text_field(body, "model")
    model = svc.catalog.lookup(name)
    if model is None:
        return openai_error(404, f"model '{name}' not found")
    if Capability.COMPLETION not in model.capabilities:
        return openai_error(400, f"{go_quote(name)} does not support generate")
    if text_field(body, "suffix"):
        return openai_error(400, f"{model.name.full} does not support insert")
    try:
        opts = _sim_options(model, body)
    except OptionError as exc:
        return openai_error(500, str(exc))
    stream, usage = _stream_flags(body)
    answer = OpenAICompletion(name, chat=False, stream=stream, include_usage=usage)
    lease = await _lease(svc, read.loading(model, None, None), opts)
    if isinstance(lease, web.Response):
        return lease
    try:
        prompt = text_field(body, "prompt")
        if prompt:
            return await answer.run(svc, request, lease, prompt, opts)
        # An empty prompt only loads the model, and says so in finish_reason.
        load = DoneReason.LOAD.value
        empty = {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}
        if not stream:
            return encoder_response(answer.body("", load, empty))
        response = await answer.finish(request, None, load, empty)
        await response.write_eof()
        return response
    finally:
        svc.scheduler.release(lease)


def _floats_base64(vector: list[float]) -> str:
    return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode()


async def embeddings(request: web.Request) -> web.StreamResponse:
    svc = services(request)
    read = reading(request)
    data = await request.read()
    cloud = cloud_passthrough(data)
    if cloud is not None:
        return openai_error(404, f"model '{cloud}' not found")
    try:
        body = bind(data, EMBEDDING)
    except BindError as exc:
        read.malformed = True
        return openai_error(400, str(exc))
    encoding = text_field(body, "encoding_format")
    if encoding and encoding.lower() not in ("float", "base64"):
        message = (
            f"Invalid value for 'encoding_format' = {encoding}. "
            "Supported values: ['float', 'base64']."
        )
        return openai_error(400, message)
    texts = body.get("input")
    if texts == "":
        texts = [""]
    if texts is None or texts == []:
        return openai_error(400, "invalid input")
    if isinstance(texts, str):
        texts = [texts]
    if not isinstance(texts, list) or not all(isinstance(t, str) for t in texts):
        return openai_error(400, "invalid input type")
    name = text_field(body, "model")
    model = svc.catalog.lookup(name) if go_trim_space(name) else None
    if model is None:
        if not go_trim_space(name):
            return openai_error(404, f"model '{name}' not found")
        return openai_error(404, f"model {go_quote(name)} not found, try pulling it first")
    try:
        opts = _sim_options(model, body)
    except OptionError as exc:
        return openai_error(500, str(exc))
    lease = await _lease(svc, read.loading(model, None, None), opts)
    if isinstance(lease, web.Response):
        return lease
    try:
        vectors, tokens = await svc.engine.embed(lease, list(texts))
    finally:
        svc.scheduler.release(lease)
    dimensions = body.get("dimensions")
    if isinstance(dimensions, int) and 0 < dimensions < len(vectors[0]):
        vectors = [v[:dimensions] for v in vectors]
    data = [
        {
            "object": "embedding",
            "embedding": _floats_base64(v) if encoding.lower() == "base64" else v,
            "index": i,
        }
        for i, v in enumerate(vectors)
    ]
    usage = {"prompt_tokens": tokens, "total_tokens": tokens}
    return encoder_response({"object": "list", "data": data, "model": name, "usage": usage})


def _model_entry(model: CatalogModel, name: str) -> dict[str, object]:
    return {
        "id": name,
        "object": "model",
        "created": int(model.modified_at),
        "owned_by": model.name.namespace,
    }


async def list_models(request: web.Request) -> web.StreamResponse:
    catalog = sorted(services(request).catalog, key=lambda m: -int(m.modified_at))
    data = [_model_entry(m, m.display) for m in catalog] or None
    return encoder_response({"object": "list", "data": data})


async def retrieve_model(request: web.Request) -> web.StreamResponse:
    name = request.match_info["model"]
    model = services(request).catalog.find(name)
    if model is None:
        return openai_error(404, f"model '{name}' not found")
    return encoder_response(_model_entry(model, name))
