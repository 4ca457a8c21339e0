"""Reading a request as llama-server's router reads it (tools/server/server.cpp,
server-models.cpp at llama-cpp-python 0.3.36's llama.cpp).

The router reads a POST body with nlohmann's `json::parse` and takes its `model` with
`json_value(body, "model", "")`: a missing, null or non-string `model` reads as "", which
it refuses (400, "model name is missing from the request") before anything loads. A GET
names its model in the query (`?model=`). Either loads the model first when it is not
running, unless `?autoload=` says otherwise (or `--no-models-autoload`).
"""

from __future__ import annotations

import json
import urllib.parse

import attrs

PROXIED_POSTS = frozenset(
    {
        "/props",
        "/completion",
        "/completions",
        "/v1/completions",
        "/chat/completions",
        "/v1/chat/completions",
        "/v1/chat/completions/control",
        "/v1/responses",
        "/responses",
        "/v1/audio/transcriptions",
        "/audio/transcriptions",
        "/v1/messages",
        "/v1/messages/count_tokens",
        "/infill",
        "/embedding",
        "/embeddings",
        "/v1/embeddings",
        "/rerank",
        "/reranking",
        "/v1/rerank",
        "/v1/reranking",
        "/tokenize",
        "/detokenize",
        "/apply-template",
        "/chat/completions/input_tokens",
        "/v1/chat/completions/input_tokens",
        "/responses/input_tokens",
        "/v1/responses/input_tokens",
        "/lora-adapters",
    }
)
"""POST routes the router hands to the model's own server, loading it first (proxy_post)."""

PROXIED_GETS = frozenset({"/metrics", "/props", "/lora-adapters", "/slots"})
"""GET routes the router hands on by `?model=` (proxy_get); `/props` without one is its own."""

LOAD = "/models/load"
UNLOAD = "/models/unload"


class Unreadable(ValueError):
    """JSON nlohmann reads that this reader cannot (nesting past Python's recursion)."""


@attrs.frozen
class Routed:
    """A request that names a model for the router: which, and whether it may load it."""

    model: str
    autoload: bool | None
    """`?autoload=` as given (true for "true" or "1"); None: the server's default."""


def is_proxied(method: str, path: str) -> bool:
    """Whether the router routes this request to a model's server (loading it)."""
    if method == "POST":
        return path in PROXIED_POSTS or path.startswith("/slots/")
    return method == "GET" and path in PROXIED_GETS


def _constant(name: str) -> float:
    raise ValueError(f"{name} is not JSON")


def read_json(body: bytes) -> object:
    """The body as nlohmann's parser reads it; ValueError where it refuses, Unreadable
    where it reads what this reader cannot."""
    try:
        value = json.loads(body, parse_constant=_constant)
    except RecursionError:
        raise Unreadable("JSON nested too deeply for the gate to read") from None
    if b"\\u" in body:
        # nlohmann refuses a lone surrogate escape; Python keeps it as a lone code point.
        _check_surrogates(value)
    return value


def _check_surrogates(value: object) -> None:
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                raise ValueError("invalid string: surrogate without its pair") from None
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)


def query_param(query: str, name: str) -> str:
    """A query parameter as cpp-httplib's `get_param` gives it: the first value, decoded."""
    for key, value in urllib.parse.parse_qsl(query, keep_blank_values=True):
        if key == name:
            return value
    return ""


def autoload_of(query: str) -> bool | None:
    """`?autoload=` as the router reads it (is_autoload): absent → the server's default."""
    text = query_param(query, "autoload")
    return None if not text else text in ("true", "1")


def routed(method: str, body: bytes | None, query: str) -> Routed | None:
    """The model a proxied request names; None when the router refuses it unread (a
    body that is not JSON, an empty name: its own 400 or 500, nothing loads)."""
    if method == "GET":
        name = query_param(query, "model")
    else:
        if body is None:
            return None
        try:
            data = read_json(body)
        except Unreadable:
            raise
        except ValueError:
            return None
        value = data.get("model") if isinstance(data, dict) else None
        name = value if isinstance(value, str) else ""
    if not name:
        return None
    return Routed(name, autoload_of(query))


def named_model(body: bytes | None) -> str | None:
    """The `model` of a /models/load or /models/unload body; None when it names none."""
    if body is None:
        return None
    try:
        data = read_json(body)
    except ValueError:
        return None
    value = data.get("model") if isinstance(data, dict) else None
    return value if isinstance(value, str) and value else None
