"""The JSON of a finished or partial completion (tools/server/server-task.cpp).

One `Completion` is what a slot produced for one request; the functions render it as each
route's dialect does: `/completion` (`to_json_non_oaicompat`), `/v1/completions`
(`to_json_oaicompat`), `/v1/chat/completions` (`to_json_oaicompat_chat`, and the chunk
lists of the `_stream` variants).
"""

from __future__ import annotations

import secrets
import string
import time
from typing import Any

import attrs

BUILD_INFO = "b1-sim"
"""`llama_build_info()`: the build number and commit; `system_fingerprint` carries it."""
_ALPHABET = string.digits + string.ascii_uppercase + string.ascii_lowercase


def random_string() -> str:
    """`random_string` (server-common.cpp): 32 characters of [0-9A-Za-z]."""
    return "".join(secrets.choice(_ALPHABET) for _ in range(32))


def completion_id() -> str:
    """`gen_chatcmplid`: `chatcmpl-` and a random string (also for /v1/completions)."""
    return "chatcmpl-" + random_string()


@attrs.define
class Timings:
    """`server_slot_stats::to_json`."""

    prompt_n: int
    prompt_ms: float
    predicted_n: int
    predicted_ms: float
    cache_n: int = 0

    def to_json(self) -> dict[str, Any]:
        def per_token(ms: float, n: int) -> float:
            return ms / n if n > 0 else 0.0

        def per_second(ms: float, n: int) -> float:
            return 1e3 / ms * n if ms > 0 else 0.0

        return {
            "cache_n": self.cache_n,
            "prompt_n": self.prompt_n,
            "prompt_ms": self.prompt_ms,
            "prompt_per_token_ms": per_token(self.prompt_ms, self.prompt_n),
            "prompt_per_second": per_second(self.prompt_ms, self.prompt_n),
            "predicted_n": self.predicted_n,
            "predicted_ms": self.predicted_ms,
            "predicted_per_token_ms": per_token(self.predicted_ms, self.predicted_n),
            "predicted_per_second": per_second(self.predicted_ms, self.predicted_n),
        }


@attrs.define
class Completion:
    """What one slot generated for one request."""

    cmpl_id: str
    model: str
    prompt: str
    prompt_tokens: int
    pieces: list[str]
    token_ids: list[int]
    stop_type: str
    """`eos`, `limit` or `word`."""
    timings: Timings
    settings: dict[str, Any]
    n_ctx: int
    id_slot: int = 0
    truncated: bool = False

    @property
    def content(self) -> str:
        return "".join(self.pieces)

    @property
    def finish_reason(self) -> str:
        return "stop" if self.stop_type in ("eos", "word") else "length"

    def usage(self) -> dict[str, Any]:
        n = len(self.pieces)
        return {
            "completion_tokens": n,
            "prompt_tokens": self.prompt_tokens,
            "total_tokens": n + self.prompt_tokens,
            "prompt_tokens_details": {"cached_tokens": self.timings.cache_n},
        }

    def native(self) -> dict[str, Any]:
        """`to_json_non_oaicompat` of the final result."""
        return {
            "index": 0,
            "content": self.content,
            "tokens": [],
            "id_slot": self.id_slot,
            "stop": True,
            "model": self.model,
            "tokens_predicted": len(self.pieces),
            "tokens_evaluated": self.prompt_tokens,
            "generation_settings": self.settings,
            "prompt": self.prompt,
            "has_new_line": "\n" in self.content,
            "truncated": self.truncated,
            "stop_type": self.stop_type,
            "stopping_word": "",
            "tokens_cached": self.prompt_tokens + len(self.pieces),
            "timings": self.timings.to_json(),
        }

    def native_partial(self, piece: str, n_decoded: int) -> dict[str, Any]:
        return {
            "index": 0,
            "content": piece,
            "tokens": [self.token_ids[n_decoded - 1]],
            "stop": False,
            "id_slot": -1,
            "tokens_predicted": n_decoded,
            "tokens_evaluated": self.prompt_tokens,
        }

    def native_final_stream(self) -> dict[str, Any]:
        final = self.native()
        final["content"] = ""
        return final

    def _head(self, kind: str, *, id_last: bool = False) -> dict[str, Any]:
        """`created`, `model`, `system_fingerprint`, `object` and `id`, in the order the
        result builds them (`id` last for final results and text chunks)."""
        head: dict[str, Any] = {"created": int(time.time())}
        if not id_last:
            head["id"] = self.cmpl_id
        head.update(model=self.model, system_fingerprint=BUILD_INFO, object=kind)
        if id_last:
            head["id"] = self.cmpl_id
        return head

    def text_completion(self) -> dict[str, Any]:
        """`to_json_oaicompat` (non-streamed)."""
        choice = {"text": self.content, "index": 0, "logprobs": None,
                  "finish_reason": self.finish_reason}  # fmt: skip
        return self._final("text_completion", choice)

    def _final(self, kind: str, choice: dict[str, Any]) -> dict[str, Any]:
        head = self._head(kind, id_last=True)
        cmpl_id = head.pop("id")
        return {"choices": [choice], **head, "usage": self.usage(), "id": cmpl_id,
                "timings": self.timings.to_json()}  # fmt: skip

    def text_completion_chunk(self, piece: str | None, final: bool = False) -> dict[str, Any]:
        choice = {"text": piece or "", "index": 0, "logprobs": None,
                  "finish_reason": self.finish_reason if final else None}  # fmt: skip
        head = self._head("text_completion", id_last=True)
        cmpl_id = head.pop("id")
        chunk = {"choices": [choice], **head}
        if final:
            chunk["usage"] = self.usage()
        chunk["id"] = cmpl_id
        if final:
            chunk["timings"] = self.timings.to_json()
        return chunk

    def chat_completion(self) -> dict[str, Any]:
        """`to_json_oaicompat_chat` (non-streamed)."""
        message = {"role": "assistant", "content": self.content}
        choice = {"finish_reason": self.finish_reason, "index": 0, "message": message}
        return self._final("chat.completion", choice)

    def chat_chunk(self, delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        choice = {"finish_reason": finish, "index": 0, "delta": delta}
        return {"choices": [choice], **self._head("chat.completion.chunk")}

    def chat_final_chunks(self, include_usage: bool) -> list[dict[str, Any]]:
        """`to_json_oaicompat_chat_stream`: the finishing chunk, the usage chunk if asked,
        `timings` on the last one."""
        chunks = [self.chat_chunk({}, self.finish_reason)]
        if include_usage:
            chunks.append({"choices": [], **self._head("chat.completion.chunk"),
                           "usage": self.usage()})  # fmt: skip
        chunks[-1]["timings"] = self.timings.to_json()
        return chunks
