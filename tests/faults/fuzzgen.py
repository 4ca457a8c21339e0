"""Seeded generator of hostile HTTP requests, as raw bytes, for the gate's two listeners.

Each request is built from Ollama's own field names with values of every JSON type, key
case changed, keys duplicated, escapes including lone surrogates and numbers JSON has no
room for, odd headers, bodies cut short and Content-Length that does not match.
"""

from __future__ import annotations

import enum
import json
import random

import attrs

from tests.faults.stack import MODELS


class Target(enum.Enum):
    GATE = "gate"
    CONTROL = "control"


class Framing(enum.Enum):
    EXACT = "exact"
    CUT_SHORT = "cut short"
    """Content-Length above the bytes sent; the client then closes its side."""
    EXTRA = "extra bytes"
    """Content-Length below the bytes sent."""
    CHUNKED = "chunked"
    BAD_CHUNKED = "bad chunked"
    NONE = "no length"


@attrs.frozen
class FuzzRequest:
    target: Target
    method: str
    path: str
    framing: Framing
    raw: bytes
    """The whole request as written on the socket."""


METHODS = ["GET", "POST", "POST", "POST", "HEAD", "PUT", "DELETE", "OPTIONS", "PATCH", "FOO"]
GATE_PATHS = [
    "/api/generate", "/api/chat", "/api/embed", "/api/embeddings", "/api/ps", "/api/tags",
    "/api/show", "/api/pull", "/api/version", "/api/delete", "/api/copy", "/api/create",
    "/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/models",
    "/v1/models/gemma3:12b", "/v1/responses", "/", "/api", "/api/", "/API/GENERATE",
    "//api/generate", "/api/generate/", "/api/generate?x=1", "/api/%67enerate", "/..%2f",
    "/api/generate#frag", "/\u00e9",
]  # fmt: skip
CONTROL_PATHS = [
    "/metrics", "/gate/v1/status", "/gate/v1/events", "/gate/v1/health", "/gate/v1/",
    "/gate/v1/status?x=%zz", "/", "/metrics/", "/gate/v2/status", "/gate/v1/leases",
]  # fmt: skip
FIELDS = [
    "model", "prompt", "messages", "stream", "keep_alive", "options", "format", "raw",
    "system", "template", "context", "images", "input", "suffix", "think", "tools",
    "truncate", "dimensions", "max_tokens", "name",
]  # fmt: skip
MODEL_NAMES = [
    *MODELS, "gemma3:12b", "llama3.2:3b", "GEMMA3:12B", "llama3.2", "bge-m3:latest",
    "registry.ollama.ai/library/gemma3:12b", "library/llama3.2:3b", "nope:1b", "",
    "gemma3:12b@sha256:" + "0" * 64, "a" * 300, "../../etc/passwd", "x:cloud",
    "gpt-oss:20b-cloud",
]  # fmt: skip
KEEP_ALIVES = ['"5m"', "0", "-1", '"-1"', "3600", '"24h"', "null", '"0s"', '"1e3"', "1e400",
               '"5 minutes"', "true", '""', '"\\ud800"', "[]", "{}", "1.5", "-0",
               "NaN"]  # fmt: skip
OPTIONS = ['{"num_predict": 3}', '{"num_predict": 1, "num_ctx": 2048}', '{"num_ctx": -1}',
           '{"num_gpu": 0, "num_predict": 2}', '{"NUM_CTX": 4096, "num_predict": 1}', "null",
           '{"num_predict": "x"}', "[]", '{"num_ctx": 1e400}', '{"main_gpu": 7}']  # fmt: skip
STRINGS = ['"hi"', '""', '"\\ud800"', '"\\udc00x"', '"\\u0000"', '"\\ud83d\\ude00"', '"\\x"',
           '"' + "a" * 2000 + '"', '"\u00e9\u4e2d"', '"\\"quoted\\""']  # fmt: skip
SCALARS = ["null", "true", "false", "0", "-1", "9223372036854775808", "1e400", "-1e400",
           "NaN", "Infinity", "1.0", "[]", "{}", '[{"role": "user", "content": "hi"}]',
           '{"a": {"b": [1, 2, {"c": null}]}}']  # fmt: skip
HEADERS = [
    "X-GPUGate-Priority: background", "X-GPUGate-Priority: production",
    "X-GPUGate-Priority: \x7f",
    "Authorization: Bearer ops-token", "Authorization: Bearer nope", "Authorization: Basic ==",
    "Origin: http://evil.example", "Origin: null", "Expect: 100-continue", "Accept: */*",
    "Content-Type: text/plain", "Content-Type: application/json; charset=latin-1",
    "Accept-Encoding: gzip, br", "Connection: keep-alive", "X-Forwarded-For: 10.0.0.1",
    "Cookie: " + "a=b; " * 200, "X-Long: " + "x" * 6000, "Range: bytes=0-1",
    "Content-Encoding: gzip", "Upgrade: websocket", "Via: 1.1 x", "TE: trailers",
]  # fmt: skip


def _key(rng: random.Random, name: str) -> str:
    roll = rng.random()
    if roll < 0.1:
        return name.upper()
    if roll < 0.2:
        return name.capitalize()
    if roll < 0.25:
        return name + " "
    return name


def _value(rng: random.Random, field: str) -> str:
    if rng.random() < 0.25:
        return rng.choice(SCALARS + STRINGS)
    if field == "model":
        return json.dumps(rng.choice(MODEL_NAMES))
    if field == "keep_alive":
        return rng.choice(KEEP_ALIVES)
    if field == "options":
        return rng.choice(OPTIONS)
    if field == "stream":
        return rng.choice(["true", "false", "false", '"yes"', "0"])
    if field == "messages":
        return rng.choice(['[{"role": "user", "content": "hi"}]', "[]", '[{"role": 1}]', '"x"'])
    if field in ("input", "prompt", "system", "suffix"):
        return rng.choice([*STRINGS, '["a", "b"]', "[]"])
    return rng.choice(SCALARS + STRINGS)


def json_body(rng: random.Random) -> bytes:
    """A JSON-ish object: mostly a plausible request, with faults mixed in."""
    fields = ["model"] if rng.random() < 0.9 else []
    fields += rng.sample(FIELDS, rng.randint(0, 5))
    if rng.random() < 0.15:
        fields.append(rng.choice(["keep_alive", "model", "stream"]))  # a duplicate key
    pairs = [f"{json.dumps(_key(rng, f))}: {_value(rng, f)}" for f in fields]
    if rng.random() < 0.7 and "options" not in fields:
        pairs.append('"options": {"num_predict": 2}')
    text = "{" + ", ".join(pairs) + "}"
    roll = rng.random()
    if roll < 0.04:
        text = text[: rng.randint(0, len(text))]  # truncated JSON
    elif roll < 0.06:
        text = rng.choice(["[]", "null", '"x"', "1", "", " ", "{", "\ufeff{}", "{}{}"])
    data = text.encode("utf-8", "surrogatepass")
    if rng.random() < 0.02:
        data += b"\xff\xfe"  # not UTF-8
    return data


def generate(rng: random.Random, host: str) -> FuzzRequest:
    """One request for the gate (mostly) or its control listener."""
    target = Target.CONTROL if rng.random() < 0.12 else Target.GATE
    paths = CONTROL_PATHS if target is Target.CONTROL else GATE_PATHS
    method = rng.choice(METHODS)
    path = rng.choice(paths)
    body = json_body(rng) if method in ("POST", "PUT", "PATCH") or rng.random() < 0.05 else b""
    headers = [f"Host: {host}" if rng.random() < 0.9 else rng.choice(["Host: x", "Host: "])]
    headers += rng.sample(HEADERS, rng.choice([0, 0, 0, 1, 1, 2, 3]))
    if rng.random() < 0.8:
        headers.append("Content-Type: application/json")
    return frame(rng, target, method, path, headers, body)


def frame(
    rng: random.Random, target: Target, method: str, path: str, headers: list[str], body: bytes
) -> FuzzRequest:
    """The request as written on the socket, its body framed one of the Framing ways."""
    framing = rng.choices(
        list(Framing), weights=[80, 5, 4, 5, 2, 4] if body else [90, 2, 2, 2, 1, 3]
    )[0]
    payload = body
    if framing is Framing.EXACT:
        headers.append(f"Content-Length: {len(body)}")
    elif framing is Framing.CUT_SHORT:
        headers.append(f"Content-Length: {len(body) + rng.randint(1, 100)}")
    elif framing is Framing.EXTRA:
        headers.append(f"Content-Length: {max(0, len(body) - rng.randint(1, 5))}")
    elif framing is Framing.CHUNKED:
        headers.append("Transfer-Encoding: chunked")
        payload = (f"{len(body):x}\r\n".encode() + body + b"\r\n" if body else b"") + b"0\r\n\r\n"
    elif framing is Framing.BAD_CHUNKED:
        headers.append("Transfer-Encoding: chunked")
        payload = b"zz\r\n" + body + b"\r\n"
    if rng.random() < 0.02:
        headers.append(f"Content-Length: {len(body) + 1}")  # two Content-Length headers
    head = f"{method} {path} HTTP/1.1\r\n" + "".join(h + "\r\n" for h in headers) + "\r\n"
    raw = head.encode("utf-8", "surrogatepass") + payload
    return FuzzRequest(target, method, path, framing, raw)
