"""The routes of a single-model llama-server (tools/server/server-context.cpp `init_routes`).

Every route is answered from the model's GGUF header and filler text: what a client sees
(status, JSON shape, token counts, usage, timings, SSE framing) is the real server's; what
the text says is not. Routes a router forwards to its child are these same handlers.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import attrs
from aiohttp import web

from gpugate_sim.llamaserver import framing
from gpugate_sim.llamaserver.framing import (
    DONE,
    INVALID_REQUEST,
    NOT_SUPPORTED,
    InvalidArgument,
    end_chunked,
    error_response,
    json_response,
    parse_json,
    sse_event,
    start_sse,
)
from gpugate_sim.llamaserver.infill import check_request, infill_tokens, missing_tokens
from gpugate_sim.llamaserver.memory import MemoryPlan
from gpugate_sim.llamaserver.model import ModelInfo
from gpugate_sim.llamaserver.results import BUILD_INFO, Completion, Timings, completion_id
from gpugate_sim.llamaserver.text import Vocab, detokenize, filler, tokenize, vocab_of

CHATML = "<|im_start|>{role}\n{content}<|im_end|>\n"


@attrs.frozen
class ServeOptions:
    """The single-model server's options that change its answers."""

    aliases: tuple[str, ...] = ()
    n_parallel: int = 4
    embeddings: bool = False
    pooling: int | None = None
    n_predict: int = -1
    tokens_per_second: float = 500.0
    prompt_tokens_per_second: float = 5000.0
    eos_after: int = 16
    """Tokens the filler gives before end-of-sequence when a request sets no limit."""


class ModelServer:
    """The routes of one llama-server process over its model."""

    def __init__(self, info: ModelInfo, plan: MemoryPlan, options: ServeOptions) -> None:
        self.info = info
        self.plan = plan
        self.options = options
        self.vocab: Vocab = vocab_of(info)
        self.ready = False
        # server.cpp: without --alias the model's name (the -m path as given) is its alias.
        self.aliases = options.aliases or (info.path,)
        self.name = self.aliases[0]
        self.slots = asyncio.Semaphore(max(1, options.n_parallel))
        self.app = web.Application(
            client_max_size=1 << 30, middlewares=[framing.make_middleware(lambda: self.ready)]
        )
        self._routes()

    def _routes(self) -> None:
        add = self.app.router
        for path in ("/health", "/v1/health"):
            add.add_get(path, self.health)
        add.add_get("/props", self.props)
        for path in ("/models", "/v1/models"):
            add.add_get(path, self.models)
        for path in ("/completion", "/completions"):
            add.add_post(path, self.completion)
        add.add_post("/v1/completions", self.oai_completion)
        for path in ("/chat/completions", "/v1/chat/completions"):
            add.add_post(path, self.chat)
        add.add_post("/infill", self.infill)
        for path in ("/embedding", "/embeddings"):
            add.add_post(path, self.embeddings)
        add.add_post("/v1/embeddings", self.oai_embeddings)
        add.add_post("/tokenize", self.tokenize)
        add.add_post("/detokenize", self.detokenize)

    # -- metadata ---------------------------------------------------------------------------

    def model_info(self) -> dict[str, Any]:
        """`get_res_model_info`: also what a router child reports when it is ready."""
        return {
            "id": self.name,
            "aliases": list(self.aliases),
            "tags": [],
            "object": "model",
            "created": int(time.time()),
            "owned_by": "llamacpp",
            "meta": {
                "vocab_type": self.info.vocab_type,
                "n_vocab": self.info.n_vocab,
                "n_ctx": self.plan.slot_ctx,
                "n_ctx_train": self.info.n_ctx_train,
                "n_embd": self.info.n_embd,
                "n_params": self.info.n_params,
                "size": self.info.size,
                "ftype": self.info.ftype,
            },
        }

    async def health(self, request: web.Request) -> web.StreamResponse:
        return json_response({"status": "ok"})

    async def models(self, request: web.Request) -> web.StreamResponse:
        details = {"parent_model": "", "format": "gguf", "family": "", "families": [""],
                   "parameter_size": "", "quantization_level": ""}  # fmt: skip
        listing = {
            "name": self.name, "model": self.name, "modified_at": "", "size": "", "digest": "",
            "type": "model", "description": "", "tags": [""], "capabilities": ["completion"],
            "parameters": "", "details": details,
        }  # fmt: skip
        return json_response({"models": [listing], "object": "list", "data": [self.model_info()]})

    async def props(self, request: web.Request) -> web.StreamResponse:
        params = self._settings(self.options.n_predict, False)
        settings = {"params": params, "n_ctx": self.plan.slot_ctx}
        return json_response({
            "default_generation_settings": settings,
            "total_slots": self.options.n_parallel,
            "model_alias": self.name,
            "model_ftype": self.info.ftype,
            "model_path": self.info.path,
            "modalities": {"vision": False, "video": False, "audio": False},
            "endpoint_slots": True,
            "endpoint_props": False,
            "endpoint_metrics": False,
            "ui": True,
            "ui_settings": {},
            "chat_template": "",
            "chat_template_caps": {},
            "bos_token": self._token_text(self.info.bos),
            "eos_token": self._token_text(self.info.eos),
            "build_info": BUILD_INFO,
            "is_sleeping": False,
            "cors_proxy_enabled": False,
        })  # fmt: skip

    def _token_text(self, token: int | None) -> str:
        if token is None or not 0 <= token < self.info.n_vocab:
            return ""
        return self.info.tokens[token]

    # -- tokens -----------------------------------------------------------------------------

    async def tokenize(self, request: web.Request) -> web.StreamResponse:
        body = parse_json(await request.read())
        tokens: list[Any] = []
        if isinstance(body, dict) and "content" in body:
            ids = tokenize(self.vocab, str(body["content"]),
                           add_special=bool(body.get("add_special", False)),
                           parse_special=bool(body.get("parse_special", True)))  # fmt: skip
            if body.get("with_pieces"):
                tokens = [{"id": t, "piece": self._piece_json(t)} for t in ids]
            else:
                tokens = list(ids)
        return json_response({"tokens": tokens})

    def _piece_json(self, token: int) -> Any:
        # A piece that is not valid UTF-8 is given as its byte values.
        raw = self.vocab.piece(token)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            return list(raw)

    async def detokenize(self, request: web.Request) -> web.StreamResponse:
        body = parse_json(await request.read())
        content = ""
        if isinstance(body, dict) and "tokens" in body:
            content = detokenize(self.vocab, [int(t) for t in body["tokens"]])
        return json_response({"content": content})

    # -- embeddings -------------------------------------------------------------------------

    async def embeddings(self, request: web.Request) -> web.StreamResponse:
        return await self._embeddings(request, oai=False)

    async def oai_embeddings(self, request: web.Request) -> web.StreamResponse:
        return await self._embeddings(request, oai=True)

    async def _embeddings(self, request: web.Request, *, oai: bool) -> web.StreamResponse:
        if not self.options.embeddings:
            return error_response(
                "This server does not support embeddings. Start it with `--embeddings`",
                NOT_SUPPORTED,
            )
        pooling = self.options.pooling if self.options.pooling is not None else self.info.pooling
        if oai and pooling == 0:
            return error_response(
                "Pooling type 'none' is not OAI compatible. Please use a different pooling type",
                INVALID_REQUEST,
            )
        body = parse_json(await request.read())
        if "input" in body:
            prompt = body["input"]
        elif "content" in body:
            oai, prompt = False, body["content"]
        else:
            return error_response('"input" or "content" must be provided', INVALID_REQUEST)
        inputs = prompt if isinstance(prompt, list) and not _numbers(prompt) else [prompt]
        if not inputs:
            return error_response('"input" must not be empty', INVALID_REQUEST)
        counts = [len(self._prompt_tokens(p)) for p in inputs]
        vectors = [_unit_vector(self.info.n_embd, i) for i in range(len(inputs))]
        if not oai:
            return json_response([{"index": i, "embedding": [v]} for i, v in enumerate(vectors)])
        data = [{"embedding": v, "index": i, "object": "embedding"} for i, v in enumerate(vectors)]
        total = sum(counts)
        return json_response({
            "model": body.get("model", self.name),
            "object": "list",
            "usage": {"prompt_tokens": total, "total_tokens": total},
            "data": data,
        })  # fmt: skip

    def _prompt_tokens(self, prompt: Any) -> list[int]:
        if isinstance(prompt, list) and _numbers(prompt):
            return [int(t) for t in prompt]
        return tokenize(self.vocab, str(prompt), add_special=True, parse_special=True)

    # -- completions ------------------------------------------------------------------------

    async def completion(self, request: web.Request) -> web.StreamResponse:
        body = parse_json(await request.read())
        return await self._complete(request, body, "native")

    async def oai_completion(self, request: web.Request) -> web.StreamResponse:
        body = parse_json(await request.read())
        return await self._complete(request, body, "text")

    async def infill(self, request: web.Request) -> web.StreamResponse:
        missing = missing_tokens(self.info.fim)
        if missing:
            return error_response(
                f"Infill is not supported by this model: {missing}", NOT_SUPPORTED
            )
        body = parse_json(await request.read())
        refused = check_request(body)
        if refused is not None:
            return error_response(*refused)
        tokens = infill_tokens(
            self.vocab, self.info.fim, body, self.plan.slot_ctx, self.options.n_predict
        )
        return await self._complete(request, {**body, "prompt": tokens}, "native")

    async def chat(self, request: web.Request) -> web.StreamResponse:
        body = parse_json(await request.read())
        if not isinstance(body, dict) or "messages" not in body:
            raise InvalidArgument("'messages' is required")
        messages = body["messages"]
        if not isinstance(messages, list):
            raise InvalidArgument("Expected 'messages' to be an array")
        parts = []
        for message in messages:
            role = str(message.get("role", "")) if isinstance(message, dict) else ""
            if role != "assistant" and "content" not in message:
                raise InvalidArgument("All non-assistant messages must contain 'content'")
            parts.append(CHATML.format(role=role, content=_text_of(message.get("content"))))
        body["prompt"] = "".join(parts) + "<|im_start|>assistant\n"
        return await self._complete(request, body, "chat")

    async def _complete(self, request: web.Request, body: Any, dialect: str) -> web.StreamResponse:
        if not isinstance(body, dict) or "prompt" not in body:
            return error_response("[json.exception.out_of_range.403] key 'prompt' not found",
                                  INVALID_REQUEST)  # fmt: skip
        prompt = body["prompt"]
        n_prompt = len(self._prompt_tokens(prompt))
        n_ctx_slot = self.plan.slot_ctx
        if n_prompt >= n_ctx_slot:
            error = framing.error_body(
                f"request ({n_prompt} tokens) exceeds the available context size "
                f"({n_ctx_slot} tokens), try increasing it",
                "exceed_context_size_error",
            )
            error.update(n_prompt_tokens=n_prompt, n_ctx=n_ctx_slot)
            return json_response({"error": error}, status=400)
        limit = _int(body.get("n_predict", body.get("max_tokens", body.get(
            "max_completion_tokens", self.options.n_predict))))  # fmt: skip
        room = n_ctx_slot - n_prompt
        if limit < 0:
            count, stop = min(self.options.eos_after, room), "eos"
            stop = stop if self.options.eos_after <= room else "limit"
        else:
            count, stop = min(limit, room), "limit"
        pieces = filler(count)
        stream = bool(body.get("stream", False))
        result = Completion(
            cmpl_id=completion_id(),
            model=self.name,
            prompt=detokenize(self.vocab, self._prompt_tokens(prompt), special=True),
            prompt_tokens=n_prompt,
            pieces=pieces,
            token_ids=[self.vocab.bytes_.get(ord(p), 0) for p in pieces],
            stop_type=stop,
            timings=Timings(n_prompt, 0.0, count, 0.0),
            settings=self._settings(limit, stream),
            n_ctx=n_ctx_slot,
        )
        async with self.slots:
            prompt_seconds = n_prompt / self.options.prompt_tokens_per_second
            await asyncio.sleep(prompt_seconds)
            result.timings.prompt_ms = prompt_seconds * 1e3
            if not stream:
                started = time.monotonic()
                await asyncio.sleep(count / self.options.tokens_per_second)
                result.timings.predicted_ms = (time.monotonic() - started) * 1e3
                return json_response(_render(result, dialect))
            return await self._stream(request, result, dialect, body)

    async def _stream(
        self, request: web.Request, result: Completion, dialect: str, body: dict[str, Any]
    ) -> web.StreamResponse:
        response = await start_sse(request)
        started = time.monotonic()
        for n, piece in enumerate(result.pieces, start=1):
            await asyncio.sleep(1 / self.options.tokens_per_second)
            if dialect == "chat":
                chunks = [result.chat_chunk({"content": piece})]
                if n == 1:
                    chunks.insert(0, result.chat_chunk({"role": "assistant", "content": None}))
            elif dialect == "text":
                chunks = [result.text_completion_chunk(piece)]
            else:
                chunks = [result.native_partial(piece, n)]
            for chunk in chunks:
                await response.write(sse_event(chunk))
        result.timings.predicted_ms = (time.monotonic() - started) * 1e3
        if dialect == "chat":
            options = body.get("stream_options")
            usage = isinstance(options, dict) and bool(options.get("include_usage"))
            for chunk in result.chat_final_chunks(usage):
                await response.write(sse_event(chunk))
        elif dialect == "text":
            await response.write(sse_event(result.text_completion_chunk(None, final=True)))
        else:
            await response.write(sse_event(result.native_final_stream()))
        if dialect != "native":
            await response.write(DONE)
        await end_chunked(request, response)
        return response

    def _settings(self, n_predict: int, stream: bool) -> dict[str, Any]:
        """The part of `task_params::to_json` a client reads back."""
        return {
            "seed": 4294967295, "temperature": 0.8, "top_k": 40, "top_p": 0.95, "min_p": 0.05,
            "n_predict": n_predict, "max_tokens": n_predict, "n_keep": 0, "stream": stream,
            "n_probs": 0, "ignore_eos": False, "samplers": [], "lora": [],
        }  # fmt: skip


def _render(result: Completion, dialect: str) -> dict[str, Any]:
    if dialect == "chat":
        return result.chat_completion()
    if dialect == "text":
        return result.text_completion()
    return result.native()


def _numbers(values: list[Any]) -> bool:
    return bool(values) and all(isinstance(v, int) and not isinstance(v, bool) for v in values)


def _int(value: Any) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return -1


def _text_of(content: Any) -> str:
    if isinstance(content, list):
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return "" if content is None else str(content)


def _unit_vector(size: int, seed: int) -> list[float]:
    """A deterministic normalised vector (llama.cpp normalises with the L2 norm by default)."""
    raw = [((i * 7 + seed * 13) % 17) - 8.0 for i in range(max(1, size))]
    norm = sum(v * v for v in raw) ** 0.5 or 1.0
    return [v / norm for v in raw]
