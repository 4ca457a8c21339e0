"""The OpenAI-compatible bodies vLLM answers with, and the simulated text in them.

Shapes follow vLLM's protocol models (vllm/entrypoints/openai/.../protocol.py,
vllm/entrypoints/serve/engine/protocol.py): `ErrorInfo` is `{message, type, param, code}`
with `code` the HTTP status as an int; chat and completion responses carry `stop_reason`
beside `finish_reason`; embeddings are `{"object": "list", "data": [...], "usage"}`.
The text does not come from a model: it is a fixed word list, one word a token, so that
answers depend only on the request.
"""

from __future__ import annotations

import hashlib
import json
import time
import uuid
from typing import Any

import attrs

WORDS = (
    "The", "quick", "brown", "fox", "jumps", "over", "the", "lazy", "dog", "while", "the",
    "simulated", "GPU", "keeps", "count", "of", "every", "byte", "it", "lends",
)  # fmt: skip
NATURAL_TOKENS = 16
"""A completion without max_tokens stops ("stop") after this many tokens."""
GARBAGE = "!"
"""What weights remapped empty (after a level-2 sleep, before reload_weights) generate."""
EMBEDDING_SIZE = 16


def error_body(message: str, err_type: str, status: int, param: str | None = None) -> dict:
    return {"error": {"message": message, "type": err_type, "param": param, "code": status}}


class BadRequest(Exception):
    """A body vLLM refuses with 400 BadRequestError."""


@attrs.frozen
class Generation:
    """One request's reading: which model, how many tokens in and out, streamed or not."""

    model: str
    prompt_tokens: int
    max_tokens: int | None
    stream: bool
    include_usage: bool
    chat: bool


def count_tokens(value: Any) -> int:
    """A stand-in tokenizer: whitespace-separated words, at least one per non-empty text."""
    if isinstance(value, str):
        return max(1, len(value.split())) if value else 0
    if isinstance(value, list):
        return sum(count_tokens(v) for v in value)
    if isinstance(value, dict):
        return count_tokens(value.get("content") or value.get("text") or "")
    if isinstance(value, int):
        return 1
    return 0


def read_generation(body: Any, chat: bool, default_model: str) -> Generation:
    if not isinstance(body, dict):
        raise BadRequest("Input should be a valid dictionary")
    field = "messages" if chat else "prompt"
    if field not in body:
        raise BadRequest(f"Field required: {field}")
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    if max_tokens is not None and (not isinstance(max_tokens, int) or max_tokens < 1):
        raise BadRequest(f"max_tokens must be at least 1, got {max_tokens}.")
    options = body.get("stream_options") or {}
    return Generation(
        model=str(body.get("model") or default_model),
        prompt_tokens=count_tokens(body[field]),
        max_tokens=max_tokens,
        stream=bool(body.get("stream", False)),
        include_usage=bool(isinstance(options, dict) and options.get("include_usage")),
        chat=chat,
    )


def planned_tokens(gen: Generation) -> tuple[int, str]:
    """How many tokens the simulated model writes, and why it stops."""
    if gen.max_tokens is not None and gen.max_tokens < NATURAL_TOKENS:
        return gen.max_tokens, "length"
    return NATURAL_TOKENS, "stop"


def token_text(index: int, garbage: bool) -> str:
    if garbage:
        return GARBAGE
    word = WORDS[index % len(WORDS)]
    return word if index == 0 else " " + word


def usage(prompt: int, completion: int) -> dict:
    return {
        "prompt_tokens": prompt,
        "total_tokens": prompt + completion,
        "completion_tokens": completion,
        "prompt_tokens_details": None,
    }


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def _choice(gen: Generation, text: str, finish: str | None, *, delta: bool) -> dict:
    choice: dict[str, Any] = {"index": 0}
    if gen.chat and delta:
        choice["delta"] = {"content": text}
    elif gen.chat:
        choice["message"] = {
            "role": "assistant",
            "content": text,
            "refusal": None,
            "annotations": None,
            "audio": None,
            "function_call": None,
            "tool_calls": [],
            "reasoning_content": None,
        }
    else:
        choice["text"] = text
    choice["logprobs"] = None
    choice["finish_reason"] = finish
    choice["stop_reason"] = None
    return choice


def response(gen: Generation, rid: str, created: int, text: str, done: int, finish: str) -> dict:
    """The whole (non-streamed) answer."""
    return {
        "id": rid,
        "object": "chat.completion" if gen.chat else "text_completion",
        "created": created,
        "model": gen.model,
        "choices": [_choice(gen, text, finish, delta=False)],
        "usage": usage(gen.prompt_tokens, done),
        "prompt_logprobs": None,
        "kv_transfer_params": None,
    }


def chunk(gen: Generation, rid: str, created: int, text: str, finish: str | None) -> dict:
    """One SSE event of a streamed answer."""
    return {
        "id": rid,
        "object": "chat.completion.chunk" if gen.chat else "text_completion",
        "created": created,
        "model": gen.model,
        "choices": [_choice(gen, text, finish, delta=True)],
    }


def role_chunk(gen: Generation, rid: str, created: int) -> dict:
    """vLLM's first chat chunk: the assistant role and empty content."""
    event = chunk(gen, rid, created, "", None)
    event["choices"][0]["delta"] = {"role": "assistant", "content": ""}
    return event


def usage_chunk(gen: Generation, rid: str, created: int, done: int) -> dict:
    """`stream_options.include_usage`: a last chunk with no choices and the usage."""
    return {
        "id": rid,
        "object": "chat.completion.chunk" if gen.chat else "text_completion",
        "created": created,
        "model": gen.model,
        "choices": [],
        "usage": usage(gen.prompt_tokens, done),
    }


def sse(event: dict | str) -> bytes:
    data = event if isinstance(event, str) else json.dumps(event, separators=(",", ":"))
    return f"data: {data}\n\n".encode()


def embedding(text: Any) -> list[float]:
    """A deterministic unit-free vector of one input."""
    digest = hashlib.sha256(json.dumps(text).encode()).digest()
    return [round((b - 128) / 128, 6) for b in digest[:EMBEDDING_SIZE]]


def embeddings_response(body: Any, default_model: str) -> dict:
    if not isinstance(body, dict) or "input" not in body:
        raise BadRequest("Field required: input")
    inputs = body["input"]
    # A list of strings (or of token lists) is a batch; a string or one token list is one.
    batch = isinstance(inputs, list) and inputs and not isinstance(inputs[0], int)
    items = inputs if batch else [inputs]
    tokens = count_tokens(items)
    return {
        "id": new_id("embd"),
        "object": "list",
        "created": int(time.time()),
        "model": str(body.get("model") or default_model),
        "data": [
            {"index": i, "object": "embedding", "embedding": embedding(item)}
            for i, item in enumerate(items)
        ],
        "usage": {
            "prompt_tokens": tokens,
            "total_tokens": tokens,
            "completion_tokens": 0,
            "prompt_tokens_details": None,
        },
    }


def model_list(names: tuple[str, ...], root: str, max_model_len: int, created: int) -> dict:
    """`GET /v1/models`: one card per served name, all rooted at the model's path."""
    return {
        "object": "list",
        "data": [
            {
                "id": name,
                "object": "model",
                "created": created,
                "owned_by": "vllm",
                "root": root,
                "parent": None,
                "max_model_len": max_model_len,
                "permission": [
                    {
                        "id": new_id("modelperm"),
                        "object": "model_permission",
                        "created": created,
                        "allow_create_engine": False,
                        "allow_sampling": True,
                        "allow_logprobs": True,
                        "allow_search_indices": False,
                        "allow_view": True,
                        "allow_fine_tuning": False,
                        "organization": "*",
                        "group": None,
                        "is_blocking": False,
                    }
                ],
            }
            for name in names
        ],
    }
