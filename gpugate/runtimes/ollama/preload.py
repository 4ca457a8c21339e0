"""The refusals Ollama v0.24.0 makes from a decoded body alone, before it schedules a load.

Each returns True where Ollama answers an error without loading (the gate then forwards
the body untouched for Ollama to word it). Refusals that depend on the model (its
capabilities, a remote model) are not here: those bodies are demands.
"""

from __future__ import annotations

import re

from gpugate.runtimes.ollama.gojson import (
    Bound,
    GoJsonError,
    fold_key,
    go_string,
    scan_value,
    shallow,
)
from gpugate.runtimes.ollama.gotypes import check, is_base64
from gpugate.runtimes.ollama.govalues import decode_bound
from gpugate.runtimes.ollama.requests import ANY, OPENAI_CHAT

_INT_OPTIONS = frozenset(
    [
        "num_ctx",
        "num_batch",
        "num_gpu",
        "main_gpu",
        "num_thread",
        "num_keep",
        "seed",
        "num_predict",
        "top_k",
        "repeat_last_n",
    ]
)
_FLOAT_OPTIONS = frozenset(
    [
        "top_p",
        "min_p",
        "typical_p",
        "temperature",
        "repeat_penalty",
        "presence_penalty",
        "frequency_penalty",
    ]
)
_BOOL_OPTIONS = frozenset({"use_mmap"})
_IMAGE_PREFIXES = tuple(f"data:image/{t};base64," for t in ("jpeg", "jpg", "png", "webp"))
_EFFORTS = frozenset({"high", "medium", "low", "max", "none"})
_JSON_WS = re.compile(r"[ \t\n\r]*")


def options_refused(options: object) -> bool:
    """api.Options.FromMap (api/types.go): a known option of the wrong JSON type."""
    if not isinstance(options, dict):
        return False
    for key, value in options.items():
        if value is None:
            continue
        cls = type(value)
        if key in _INT_OPTIONS or key in _FLOAT_OPTIONS:
            if cls not in (int, float):
                return True
        elif key in _BOOL_OPTIONS:
            if cls is not bool:
                return True
        elif key == "stop" and (cls is not list or any(type(i) is not str for i in value)):
            return True
    return False


def _top_logprobs_refused(value: object) -> bool:
    return type(value) is int and not 0 <= value <= 20


def generate_refused(bound: Bound) -> bool:
    """routes.go:205 top_logprobs, checked before the model is resolved. The raw (:373) and
    options (:137) checks come after an image model's request was handed on (:368): they
    depend on the model (ollama_needs.Needs.refused_unless_image)."""
    return _top_logprobs_refused(bound.get("top_logprobs", 0))


def chat_refused(bound: Bound) -> bool:
    """routes.go:2190 top_logprobs, :137 options."""
    return _top_logprobs_refused(bound.get("top_logprobs", 0)) or options_refused(
        bound.get("options")
    )


def embed_input_refused(value: object) -> bool:
    """routes.go:713-732: input is a string, an array of strings, or null."""
    if value is None or type(value) is str:
        return False
    return type(value) is not list or any(type(item) is not str for item in value)


def embed_refused(bound: Bound) -> bool:
    return embed_input_refused(bound.get("input")) or options_refused(bound.get("options"))


def embeddings_refused(bound: Bound) -> bool:
    return options_refused(bound.get("options"))


def arguments_refused(text: object) -> bool:
    """FromCompletionToolCall: json.Unmarshal of the arguments string into
    ToolCallFunctionArguments (an object or null, the whole text one value)."""
    text = text if type(text) is str else ""
    pos = _JSON_WS.match(text).end()
    if pos == len(text):
        return True
    try:
        value, end = scan_value(text, pos, shallow(text))
        if _JSON_WS.match(text, end).end() != len(text):
            return True
        if value is not None and type(value) is not tuple:
            return True
        check(value, ANY)
    except GoJsonError:
        return True
    return False


def image_refused(url: str) -> bool:
    """decodeImageURL (openai/openai.go:675)."""
    if url.startswith(("http://", "https://")):
        return True
    if url.startswith("data:;base64,"):
        data = url[len("data:;base64,") :]
    else:
        prefix = next((p for p in _IMAGE_PREFIXES if url.startswith(p)), None)
        if prefix is None:
            return True
        data = url[len(prefix) :]
    return not is_base64(data)


def _part_refused(part: object) -> bool:
    """One element of an array content, as map[string]any (openai.go:494-540)."""
    if type(part) is not dict:
        return True
    kind = part.get("type")
    if kind == "text":
        return type(part.get("text")) is not str
    if kind == "image_url":
        image = part.get("image_url")
        url = image.get("url") if type(image) is dict else image
        return type(url) is not str or image_refused(url)
    if kind == "input_audio":
        audio = part.get("input_audio")
        if type(audio) is not dict:
            return True
        payload = audio.get("data")
        return type(payload) is not str or not is_base64(payload)
    return True


def _calls_refused(calls: object) -> bool:
    """FromCompletionToolCall: every call's arguments string must unmarshal."""
    for call in calls or ():
        function = (call or {}).get("function") or {}
        if arguments_refused(function.get("arguments", "")):
            return True
    return False


def openai_chat_refused(bound: Bound) -> bool:
    """middleware/openai.go:417 no messages; openai.go:477 FromChatRequest; then
    routes.go:2190 top_logprobs. Messages as Go holds them after every duplicate."""
    messages = decode_bound(bound, OPENAI_CHAT, "messages")
    if not messages:
        return True
    produced = 0
    for message in messages:
        message = message or {}
        content = message.get("content")
        calls = message.get("tool_calls")
        if type(content) is str:
            if _calls_refused(calls):
                return True
            produced += 1
        elif type(content) is list:
            if any(_part_refused(part) for part in content):
                return True
            produced += len(content)
            if produced and calls and _calls_refused(calls):
                return True
        else:
            if calls is None:
                return True  # content is only optional with tool calls (nil, not [])
            if _calls_refused(calls):
                return True
            produced += 1
    effort = chat_completion_effort(bound)
    if effort and effort not in _EFFORTS:
        return True
    return _top_logprobs_refused(bound.get("top_logprobs", 0))


def chat_completion_effort(bound: Bound) -> str:
    """FromChatRequest's effort (openai/openai.go:628): a `reasoning` that is not null
    decides, even with no effort in it; else `reasoning_effort`."""
    reasoning = decode_bound(bound, OPENAI_CHAT, "reasoning")
    if reasoning is not None:
        return reasoning.get("effort", "")
    return bound.get("reasoning_effort", "")


def openai_completion_refused(bound: Bound) -> bool:
    """openai.go:729 stop elements must be strings; routes.go:205 top_logprobs from
    logprobs."""
    stop = bound.get("stop")
    if type(stop) is list and any(type(item) is not str for item in stop):
        return True
    logprobs = bound.get("logprobs")
    return type(logprobs) is int and logprobs > 20


def openai_embed_refused(bound: Bound) -> bool:
    """middleware/openai.go:366-386 encoding_format and input; routes.go:713 input."""
    encoding = bound.get("encoding_format", "")
    if encoding and fold_key(encoding) not in ("FLOAT", "BASE64"):
        return True
    value = bound.get("input")
    if value == "":
        return False
    if value is None or value == []:
        return True
    return embed_input_refused(value)


def image_generation_refused(bound: Bound) -> bool:
    """ImageGenerationsMiddleware (middleware/openai.go:601): prompt, then model, required.

    FromImageGenerationRequest cannot fail, and GenerateHandler's own refusals before
    loading (routes.go:206 top_logprobs, :373 raw) cannot fire on the request it makes.
    An image model refuses a size over 4096 (routes.go:2763), but any other model loads
    for the same body: that refusal depends on the model, so the body is a demand.
    """
    return not bound.get("prompt") or not bound.get("model")


def image_edit_refused(bound: Bound) -> bool:
    """ImageEditsMiddleware (middleware/openai.go:636): prompt, model and image required;
    then FromImageEditRequest (openai/openai.go:890) must decode the image."""
    if image_generation_refused(bound):
        return True
    image = bound.get("image")
    return not image or image_refused(go_string(image))


PRELOAD = {
    "/api/generate": generate_refused,
    "/api/chat": chat_refused,
    "/api/embed": embed_refused,
    "/api/embeddings": embeddings_refused,
    "/v1/chat/completions": openai_chat_refused,
    "/v1/completions": openai_completion_refused,
    "/v1/embeddings": openai_embed_refused,
    "/v1/images/generations": image_generation_refused,
    "/v1/images/edits": image_edit_refused,
}
