"""Seeded corpus for the fuzzer with an oracle: requests a runtime might read as a load.

Every case carries `case=<id>` in its query string (runtimes ignore it), so what a runtime
or the reader in front of it records can be matched to the client's answer. The corpus is
written from the runtimes' documented request shapes, not from the gate's reader:

* per-route Ollama bodies (native and OpenAI-compatible) with each field's type changed,
  nested fields of the wrong type, key case and duplicates, lone surrogates, trailing
  bytes, nesting to 10,000 and past it, model-name spellings, keep_alive forms;
* loads bent where a copy of Go's JSON reading goes wrong (oraclegen_go.py): null members,
  keys Go folds and keys only Python folds, case-variant duplicates, nested options, the
  formats and templates Ollama refuses once the model is loaded;
* framing: every hop-by-hop header named in `Connection`, Content-Length and
  Transfer-Encoding combinations, pipelined and smuggled requests, upgrades;
* content encodings on both runtimes; origins and hosts, absolute-form request lines;
* ComfyUI prompts that queue, that ComfyUI refuses, and that it cannot read;
* the control listener, with hosts and tokens of any bytes.
"""

from __future__ import annotations

import enum
import functools
import gzip
import io
import json
import random
import wave
import zlib

import attrs

from tests.faults.oraclegen_go import go_reading_body

MODELS = ("gemma3:12b", "llama3.2:3b", "bge-m3")
"""The simulated Ollama's models (tests.faults.stack)."""
WHISPER_MODELS = ("models/ggml-large-v3-turbo.bin", "models/ggml-base.en.bin")
"""The simulated whisper-server's models (tests.faults.oracle_stack)."""


@functools.cache
def _wav() -> bytes:
    """A tenth of a second of silence, as whisper-server reads audio."""
    out = io.BytesIO()
    with wave.open(out, "wb") as wav:
        wav.setnchannels(1)
        wav.setsampwidth(2)
        wav.setframerate(16000)
        wav.writeframes(b"\0\0" * 1600)
    return out.getvalue()


class Listener(enum.Enum):
    OLLAMA = "ollama"
    COMFYUI = "comfyui"
    WHISPER = "whisper"
    CONTROL = "control"


@attrs.frozen
class Case:
    id: str
    listener: Listener
    kind: str
    """What the case exercises (a row of the summary)."""
    raw: bytes
    """Everything written on the connection."""
    answers: int = 1
    """How many answers to read (pipelined requests)."""
    head_only: bool = False
    """A HEAD request: the answer has no body."""
    close_after: bool = False
    """Shut the write side after sending (a body cut short)."""


NAMES = [
    *MODELS, "GEMMA3:12B", "llama3.2", "Llama3.2:3B", "library/llama3.2:3b",
    "registry.ollama.ai/library/bge-m3:latest", "bge-m3:latest", " llama3.2:3b",
    "llama3.2:3b\n", "\tbge-m3", " bge-m3:latest ", "\u00a0llama3.2:3b", "llama3.2:3b\u3000",
    "\u0085bge-m3", "nope:1b", "", "x:cloud", "gpt-oss:20b-cloud", "llama3.2:3b:cloud",
    "gemma3:12b@sha256:" + "0" * 64, "a" * 300, "../bge-m3", "bge-m3:local",
    "llama3.2:3b:local:cloud",
]  # fmt: skip
KEEP_ALIVES = [
    '"5m"', "0", "-1", '"-1m"', "300", '"24h"', "null", '"0s"', '"1e3"', "1e400", "1e300",
    '"9999999h"', '"2562047h"', '"2562048h"', '"2562047h47m16.854775807s"', '"300"', "true",
    '""', '"\\ud800"', "[]", "{}", "1.5", "-0", "1e-10", '"1h2m3s4ms5us6ns"', '"1.5h"',
    '"+5m"', '".5s"', '"5.s"', '"1\u00b5s"',
]  # fmt: skip
STRINGS = ['"hi"', '""', '"\\ud800"', '"\\udc00x"', '"\\u0000"', '"\\ud83d\\ude00"',
           '"\u00e9\u4e2d"', '"a\\"b"']  # fmt: skip
WRONG = ["null", "true", "0", "-1", "1.5", "1e400", "9223372036854775808", "[]", "{}", '"x"',
         '[1, "a"]', '{"a": 1}']  # fmt: skip
MESSAGES = [
    '[{"role": "user", "content": "hi"}]', "[]", '[{"role": "user"}]', '[{"role": 1}]',
    '[{"role": "user", "content": "hi", "images": ["aGk="]}]',
    '[{"role": "user", "content": "hi", "images": ["not base64!"]}]',
    '[{"role": "user", "content": "hi", "images": [1]}]',
    '[{"role": "user", "content": [{"type": "text", "text": "hi"}]}]',
    '[{"role": "user", "content": "hi", "tool_calls": [{"function": {"name": "f", '
    '"arguments": {"a": 1}}}]}]',
    '[{"role": "user", "content": "hi", "tool_calls": [{"function": {"name": "f", '
    '"arguments": "x"}}]}]',
    '[{"Role": "user", "CONTENT": "hi"}]', '"hi"', "null", '[{"role": "user", "content": 5}]',
    '[{"role": "user", "content": "hi", "thinking": 1}]',
]  # fmt: skip
OPTIONS = ['{"num_predict": 2}', '{"num_ctx": 2048, "num_predict": 1}', '{"num_ctx": "x"}',
           '{"NUM_CTX": 4096}', '{"num_gpu": 0}', "null", "[]", '{"num_ctx": 1e400}',
           '{"num_predict": 1.5}', '{"temperature": "hot"}', '{"stop": "x"}',
           '{"stop": ["x", 1]}', '{"unknown": [1,2,3]}']  # fmt: skip
THINKS = ["true", "false", '"high"', '"medium"', '"low"', '"max"', '"x"', "1", "null"]
FORMATS = ['"json"', "{}", '{"type": "object"}', "1", "null", '"x"']


def _native_fields(route: str) -> dict[str, list[str]]:
    """Fields of Ollama's documented request body for a native route, with values to try."""
    common = {"keep_alive": KEEP_ALIVES, "options": OPTIONS, "stream": ["true", "false", '"no"']}
    if route == "/api/generate":
        return {
            **common, "prompt": STRINGS, "suffix": STRINGS, "system": STRINGS,
            "template": STRINGS, "context": ["[1, 2]", '["a"]', "[]"], "raw": ["true", "1"],
            "images": ['["aGk="]', '["%%"]', "[1]", "[]"], "format": FORMATS, "think": THINKS,
            "top_logprobs": ["0", "20", "21", "-1", "1.5"], "logprobs": ["true", '"x"'],
            "truncate": ["true", "1"], "shift": ["false", "[]"],
        }  # fmt: skip
    if route == "/api/chat":
        return {
            **common, "messages": MESSAGES, "tools": ['[{"type": "function", "function": '
            '{"name": "f", "parameters": {"type": "object", "properties": {"a": {"type": '
            '"string"}}}}}]', '[{"type": 1}]', '"x"', "[]"], "format": FORMATS, "think": THINKS,
            "top_logprobs": ["0", "21"], "truncate": ["true", "1"],
        }  # fmt: skip
    if route == "/api/embed":
        return {**common, "input": ['"hi"', '["a", "b"]', "[]", "[1]", "1", "null", '""'],
                "truncate": ["true", "1"], "dimensions": ["3", '"3"', "1.5"]}  # fmt: skip
    return {**common, "prompt": STRINGS}


def _openai_fields(route: str) -> dict[str, list[str]]:
    """Fields of the OpenAI- and Anthropic-compatible request bodies, with values to try."""
    if route == "/v1/chat/completions":
        return {
            "messages": MESSAGES, "stream": ["true", "false", '"yes"'],
            "max_tokens": ["2", '"2"', "1.5"], "temperature": ["0.5", '"hot"'],
            "stop": ['"x"', '["x"]', "[1]"], "tools": ["[]", '"x"'],
            "reasoning_effort": ['"low"', '"x"', "1"], "stream_options": ['{"include_usage": 1}'],
            "response_format": ['{"type": "json_object"}', "1"], "logprobs": ["true", "1"],
            "top_logprobs": ["2", "21"],
        }  # fmt: skip
    if route == "/v1/completions":
        return {"prompt": ['"hi"', '["a"]', "1", "null"], "messages": ["1", "[]"],
                "max_tokens": ["2", '"2"'], "stop": ['"x"', '["x", 1]'], "stream": ["true", '"x"'],
                "logprobs": ["2", "21", '"x"'], "suffix": ['"s"', "1"]}  # fmt: skip
    if route == "/v1/embeddings":
        return {"input": ['"hi"', '["a"]', '""', "[]", "[1, 2]", "null", "1"],
                "stream": ['"yes"', "true"], "encoding_format": ['"float"', '"base64"', '"x"'],
                "dimensions": ["3", '"3"']}  # fmt: skip
    if route == "/v1/responses":
        return {"input": ['"hi"', '[{"role": "user", "content": "hi"}]', "1", "[]",
                          '[{"type": "message", "role": "user", "content": [{"type": '
                          '"input_text", "text": "hi"}]}]'],
                "instructions": ['"be brief"', "1"], "stream": ["true", '"x"'],
                "max_output_tokens": ["2", '"2"'], "tools": ["[]", "1"],
                "reasoning": ['{"effort": "low"}', "1"]}  # fmt: skip
    return {"messages": ['[{"role": "user", "content": "hi"}]', "[]", '"x"',
                         '[{"role": "user", "content": [{"type": "text", "text": "hi"}]}]'],
            "max_tokens": ["2", '"2"', "null"], "system": ['"s"', "1"],
            "stream": ["true", '"x"'], "thinking": ['{"type": "enabled", "budget_tokens": 1}',
                                                    "1"]}  # fmt: skip


NATIVE = ("/api/generate", "/api/chat", "/api/embed", "/api/embeddings")
OPENAI = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/responses",
          "/v1/messages")  # fmt: skip
ELSEWHERE = ("/api/tags", "/api/ps", "/api/show", "/api/version", "/", "/v1/models",
             "/api/generate/", "//api/generate", "/api/%67enerate", "/API/GENERATE")  # fmt: skip
VALID = {
    "/api/generate": {"prompt": '"hi"'},
    "/api/chat": {"messages": '[{"role": "user", "content": "hi"}]'},
    "/api/embed": {"input": '"hi"'},
    "/api/embeddings": {"prompt": '"hi"'},
    "/v1/chat/completions": {"messages": '[{"role": "user", "content": "hi"}]'},
    "/v1/completions": {"prompt": '"hi"'},
    "/v1/embeddings": {"input": '"hi"'},
    "/v1/responses": {"input": '"hi"'},
    "/v1/messages": {"messages": '[{"role": "user", "content": "hi"}]', "max_tokens": "2"},
}


def _key(rng: random.Random, name: str) -> str:
    roll = rng.random()
    if roll < 0.08:
        return name.upper()
    if roll < 0.14:
        return name.capitalize()
    if roll < 0.16:
        return name.replace("k", "\u212a").replace("s", "\u017f")  # Go folds these to K, S
    return name


def _nest(depth: int) -> str:
    return "[" * depth + "]" * depth


GO_READING_ROUTES = ("/api/generate", "/api/chat", "/api/embed", "/api/embeddings",
                     "/v1/chat/completions", "/v1/completions", "/v1/embeddings")  # fmt: skip


def ollama_body(rng: random.Random, route: str) -> str:
    """A body for an Ollama demand route: half of them a load bent where a copy of Go's
    JSON reading goes wrong (oraclegen_go), a quarter a plain request of an installed
    model, the rest a plausible request with faults."""
    if route in GO_READING_ROUTES and rng.random() < 0.5:
        return go_reading_body(rng, route)
    if rng.random() < 0.5:
        pairs = [("model", json.dumps(rng.choice(NAMES[:12])))]
        pairs += list(VALID[route].items())
        if route in NATIVE:
            pairs.append(("options", '{"num_predict": 2}'))
            if rng.random() < 0.3:
                pairs.append(("keep_alive", rng.choice(KEEP_ALIVES[:12])))
        rng.shuffle(pairs)
        return "{" + ", ".join(f"{json.dumps(_key(rng, k))}: {v}" for k, v in pairs) + "}"
    fields = _native_fields(route) if route in NATIVE else _openai_fields(route)
    pairs = []
    if rng.random() < 0.95:
        pairs.append(("model", json.dumps(rng.choice(NAMES), ensure_ascii=rng.random() < 0.5)))
    for name, value in VALID[route].items():
        if rng.random() < 0.85:
            pairs.append((name, value))
    for name in rng.sample(sorted(fields), rng.randint(0, 3)):
        pairs.append((name, rng.choice(fields[name])))
    if route in NATIVE and rng.random() < 0.5:
        pairs.append(("options", '{"num_predict": 2}'))
    if rng.random() < 0.1:
        name = rng.choice([n for n, _ in pairs] or ["model"])
        pairs.append((name, rng.choice([*WRONG, *STRINGS])))  # a duplicate key
    if rng.random() < 0.08:
        where = rng.choice(["x", "options", "format"])
        depth = rng.choice([5, 500, 988, 989, 990, 991, 9_998, 9_999, 10_000, 10_001, 12_000])
        nested = _nest(depth - 1)
        value = '{"x": ' + nested + "}" if where == "options" else nested
        pairs.append((where, value))
    if rng.random() < 0.05:
        pairs.append((rng.choice(["\\ud800", "k\\u0065ep_alive", "MODEL"]), rng.choice(WRONG)))
    rng.shuffle(pairs)
    text = "{" + ", ".join(f"{json.dumps(_key(rng, k))}: {v}" for k, v in pairs) + "}"
    roll = rng.random()
    if roll < 0.03:
        text += rng.choice(["garbage", "{}", "]", '{"model": "bge-m3"}'])  # after the value
    elif roll < 0.05:
        text = text[: rng.randint(0, len(text))]
    elif roll < 0.06:
        text = rng.choice(["", " ", "null", "[]", '"x"', "\ufeff{}", "{}"])
    return text


def _request(
    method: str,
    target: str,
    headers: list[str],
    body: bytes | None,
    *,
    framing: str = "length",
) -> bytes:
    lines = [f"{method} {target} HTTP/1.1", *headers]
    payload = b""
    if body is not None:
        if framing == "length":
            lines.append(f"Content-Length: {len(body)}")
            payload = body
        elif framing == "chunked":
            lines.append("Transfer-Encoding: chunked")
            cut = len(body) // 2
            parts = [body[:cut], body[cut:]]
            payload = b"".join(b"%x\r\n%b\r\n" % (len(p), p) for p in parts if p) + b"0\r\n\r\n"
    head = "\r\n".join(lines) + "\r\n\r\n"
    return head.encode("utf-8", "surrogatepass") + payload


HOP_BY_HOP = ["Content-Length", "Transfer-Encoding", "Host", "Keep-Alive", "TE", "Trailer",
              "Upgrade", "Proxy-Authorization", "Content-Type", "Expect", "X-Case",
              "Content-Encoding"]  # fmt: skip
ORIGINS = ["http://localhost:3000", "http://127.0.0.1", "https://0.0.0.0:8443", "app://x",
           "http://localhostevil.example", "http://localhost.evil.example",
           "http://127.0.0.1.evil.example", "http://localhost@evil.example",
           "http://localhost, http://evil.example", "null", "http://evil.example", "file://",
           "vscode-webview://abc", "chrome-extension://abc", "HTTP://LOCALHOST:3000"]  # fmt: skip
HOSTS = ["localhost:{port}", "127.0.0.1:{port}", "evil.example", "8.8.8.8:{port}",
         "192.168.1.2:{port}", "gpu.local:{port}", "[::1]:{port}", "", "localhost."]  # fmt: skip


class Corpus:
    """Cases for a stack whose listeners are on the given ports."""

    def __init__(
        self, rng: random.Random, ollama_port: int, comfy_port: int, whisper_port: int
    ) -> None:
        self.rng = rng
        self.ollama_port = ollama_port
        self.comfy_port = comfy_port
        self.whisper_port = whisper_port
        self.count = 0

    def next(self) -> Case:
        rng = self.rng
        self.count += 1
        case = str(self.count)
        roll = rng.random()
        if roll < 0.50:
            return self.ollama(case)
        if roll < 0.62:
            return self.framing(case)
        if roll < 0.70:
            return self.encoded(case)
        if roll < 0.86:
            return self.comfyui(case)
        if roll < 0.93:
            return self.whisper(case)
        return self.control(case)

    # -- Ollama ----------------------------------------------------------------------------

    def _host(self, port: int) -> str:
        rng = self.rng
        if rng.random() < 0.85:
            return f"Host: localhost:{port}"
        return "Host: " + rng.choice(HOSTS).format(port=port)

    def _extra(self) -> list[str]:
        rng = self.rng
        headers = []
        if rng.random() < 0.15:
            headers.append("Origin: " + rng.choice(ORIGINS))
        if rng.random() < 0.05:
            headers.append("Expect: " + rng.choice(["100-continue", "nope", "100-Continue"]))
        if rng.random() < 0.05:
            headers.append("X-GPUGate-Priority: " + rng.choice(["background", "production"]))
        return headers

    def ollama(self, case: str) -> Case:
        rng = self.rng
        if rng.random() < 0.08:
            path = rng.choice(ELSEWHERE)
            method = rng.choice(["GET", "POST", "HEAD", "OPTIONS"])
        else:
            path = rng.choice(NATIVE + OPENAI)
            method = "POST" if rng.random() < 0.95 else rng.choice(["GET", "PUT", "OPTIONS"])
        body = ollama_body(rng, path if path in VALID else "/api/generate").encode(
            "utf-8", "surrogatepass"
        )
        target = f"{path}?case={case}"
        if rng.random() < 0.03:
            target = (
                f"http://{rng.choice(['localhost', 'evil.example'])}:{self.ollama_port}{target}"
            )
        headers = [self._host(self.ollama_port), "Content-Type: application/json", *self._extra()]
        raw = _request(method, target, headers, None if method in ("GET", "HEAD") else body,
                       framing="chunked" if rng.random() < 0.15 else "length")  # fmt: skip
        return Case(case, Listener.OLLAMA, f"ollama {path}", raw, head_only=method == "HEAD")

    # -- framing ---------------------------------------------------------------------------

    def _inner(self, case: str, port: int) -> bytes:
        body = json.dumps({"model": self.rng.choice(MODELS), "prompt": "hi", "keep_alive": -1,
                           "options": {"num_predict": 1}}).encode()  # fmt: skip
        return _request("POST", f"/api/generate?case={case}", [f"Host: localhost:{port}"], body)

    def framing(self, case: str) -> Case:
        rng = self.rng
        port = self.ollama_port
        inner = self._inner(case + "s", port)
        host = f"Host: localhost:{port}"
        kind = rng.choice(["connection", "smuggle-te", "pipeline", "te", "upgrade", "cl-te"])
        if kind == "connection":
            named = ", ".join(rng.sample(HOP_BY_HOP, rng.randint(1, 3)))
            raw = _request(
                rng.choice(["GET", "POST"]), f"/api/tags?case={case}",
                [host, f"Connection: {named}"], inner,
                framing=rng.choice(["length", "chunked"]),
            )  # fmt: skip
            return Case(case, Listener.OLLAMA, "framing: Connection names a header", raw)
        if kind == "smuggle-te":
            raw = (
                (
                    f"POST /api/show?case={case} HTTP/1.1\r\n{host}\r\nContent-Length: 4\r\n"
                    f"Connection: Content-Length\r\nTransfer-Encoding: chunked\r\n\r\n"
                ).encode()
                + b"0\r\n\r\n"
                + inner
            )
            return Case(case, Listener.OLLAMA, "framing: CL and TE", raw, answers=2)
        if kind == "pipeline":
            first = _request("GET", f"/api/version?case={case}", [host], None)
            return Case(case, Listener.OLLAMA, "framing: pipelined", first + inner, answers=2)
        if kind == "te":
            coding = rng.choice(["gzip, chunked", "chunked, gzip", "identity", "Chunked",
                                 "chunked ", "x"])  # fmt: skip
            body = b'{"model": "bge-m3", "input": "hi"}'
            raw = (
                f"POST /api/embed?case={case} HTTP/1.1\r\n{host}\r\n"
                f"Transfer-Encoding: {coding}\r\n\r\n"
            ).encode() + b"%x\r\n%b\r\n0\r\n\r\n" % (len(body), body)
            return Case(case, Listener.OLLAMA, "framing: transfer codings", raw)
        if kind == "upgrade":
            body = inner if rng.random() < 0.5 else b""
            raw = _request(
                "GET", f"/ws?case={case}",
                [host, "Connection: Upgrade", f"Upgrade: {rng.choice(['websocket', 'h2c'])}",
                 "Sec-WebSocket-Version: 13", "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ=="],
                body or None,
            )  # fmt: skip
            return Case(case, Listener.OLLAMA, "framing: upgrade", raw)
        raw = (
            f"POST /api/tags?case={case} HTTP/1.1\r\n{host}\r\nContent-Length: {len(inner)}\r\n"
            f"Content-Length: {len(inner) + 1}\r\n\r\n"
        ).encode() + inner
        return Case(case, Listener.OLLAMA, "framing: two lengths", raw)

    # -- encodings -------------------------------------------------------------------------

    def encoded(self, case: str) -> Case:
        rng = self.rng
        coding = rng.choice(["gzip", "deflate", "GZIP", "br", "zstd", "identity",
                             "gzip, identity", "x-gzip"])  # fmt: skip
        if rng.random() < 0.5:
            port, listener = self.ollama_port, Listener.OLLAMA
            path = rng.choice(NATIVE + OPENAI)
            plain = ollama_body(rng, path).encode("utf-8", "surrogatepass")
        else:
            port, listener = self.comfy_port, Listener.COMFYUI
            path = rng.choice(["/prompt", "/api/prompt"])
            plain = json.dumps({"prompt": self._graph()}).encode()
        if coding.lower() in ("gzip", "x-gzip"):
            data = gzip.compress(plain)
        elif coding == "deflate":
            data = zlib.compress(plain)
        else:
            data = plain
        headers = [f"Host: localhost:{port}", f"Content-Encoding: {coding}"]
        raw = _request("POST", f"{path}?case={case}", headers, data)
        return Case(case, listener, f"encoding {coding} ({listener.value})", raw)

    # -- ComfyUI ---------------------------------------------------------------------------

    def _graph(self) -> dict[str, object]:
        rng = self.rng
        ckpt = rng.choice(["v1-5-pruned-emaonly-fp16.safetensors"] * 4 + ["missing.ckpt"])
        graph: dict[str, object] = {
            "4": {"class_type": "CheckpointLoaderSimple", "inputs": {"ckpt_name": ckpt}},
            "6": {"class_type": "CLIPTextEncode", "inputs": {"text": "a cat", "clip": ["4", 1]}},
            "7": {"class_type": "CLIPTextEncode", "inputs": {"text": "", "clip": ["4", 1]}},
            "5": {"class_type": "EmptyLatentImage",
                  "inputs": {"width": 64, "height": 64, "batch_size": 1}},
            "3": {"class_type": "KSampler",
                  "inputs": {"model": ["4", 0], "seed": 1, "steps": 1, "cfg": 8.0,
                             "sampler_name": "euler", "scheduler": "normal", "positive": ["6", 0],
                             "negative": ["7", 0], "latent_image": ["5", 0], "denoise": 1.0}},
            "8": {"class_type": "VAEDecode", "inputs": {"samples": ["3", 0], "vae": ["4", 2]}},
            "9": {"class_type": "SaveImage",
                  "inputs": {"images": ["8", 0], "filename_prefix": "fuzz"}},
        }  # fmt: skip
        fault = rng.random()
        nodes = graph
        if fault < 0.08:
            del nodes["3"]["inputs"]["steps"]  # type: ignore[index]
        elif fault < 0.14:
            nodes["3"]["inputs"]["steps"] = "many"  # type: ignore[index]
        elif fault < 0.18:
            nodes["3"]["inputs"]["sampler_name"] = "nope"  # type: ignore[index]
        elif fault < 0.22:
            nodes["3"]["inputs"]["cfg"] = 1e9  # type: ignore[index]
        elif fault < 0.26:
            nodes["10"] = {"class_type": "NoSuchNode", "inputs": {}}
        elif fault < 0.30:
            del nodes["9"]
        elif fault < 0.33:
            nodes["8"]["inputs"]["vae"] = ["6", 0]  # type: ignore[index]
        return graph

    def comfyui(self, case: str) -> Case:
        rng = self.rng
        port = self.comfy_port
        path = rng.choice(["/prompt", "/api/prompt", "/prompt", "/queue", "/history"])
        method = "POST" if rng.random() < 0.9 else "GET"
        fields: dict[str, object] = {"prompt": self._graph(), "client_id": "fuzz"}
        if rng.random() < 0.1:
            fields["number"] = rng.choice([1, "x", None, 1e400])
        if rng.random() < 0.05:
            fields["prompt_id"] = rng.choice(["\ud800", "p" * 300, 5])
        text = json.dumps(fields)
        roll = rng.random()
        if roll < 0.04:
            text = text[:-1] + ', "x": ' + _nest(rng.choice([800, 899, 900, 950, 1500])) + "}"
        elif roll < 0.07:
            text = rng.choice(["", "[]", "{", '{"prompt": []}', '{"client_id": 1}'])
        body = text.encode("utf-8", "surrogatepass")
        headers = [self._host(port), *self._extra()]
        if rng.random() < 0.1:
            headers.append(
                "Content-Type: application/json; charset="
                + rng.choice(["latin-1", "utf-16", "x-nope", "utf-8"])
            )
        raw = _request(method, f"{path}?case={case}", headers,
                       body if method == "POST" else None)  # fmt: skip
        return Case(case, Listener.COMFYUI, f"comfyui {method} {path.removeprefix('/api')}", raw)

    # -- whisper.cpp -----------------------------------------------------------------------

    def whisper(self, case: str) -> Case:
        rng = self.rng
        port = self.whisper_port
        path = rng.choice(["/inference", "/inference", "/load", "/health", "/", "/nope"])
        boundary = "fuzzboundary"
        fields: list[tuple[str, str | None, bytes]] = []
        if path == "/load" or rng.random() < 0.05:
            model = rng.choice([*WHISPER_MODELS, WHISPER_MODELS[1], "models/none.bin", ""])
            fields.append(("model", None, model.encode()))
        if path == "/inference" and rng.random() < 0.9:
            fields.append(("file", "a.wav", _wav() if rng.random() < 0.9 else b"not audio"))
            fields.append(("response_format", None, b"json"))
        body = (
            b"".join(
                f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"'.encode()
                + (f'; filename="{filename}"'.encode() if filename else b"")
                + b"\r\n\r\n"
                + value
                + b"\r\n"
                for name, filename, value in fields
            )
            + f"--{boundary}--\r\n".encode()
        )
        headers = [
            f"Host: 127.0.0.1:{port}",
            f"Content-Type: multipart/form-data; boundary={boundary}",
            *self._extra(),
        ]
        if rng.random() < 0.08:
            coding = rng.choice(["gzip", "deflate", "br"])
            headers.append(f"Content-Encoding: {coding}")
            body = gzip.compress(body) if coding == "gzip" else body
        method = "GET" if path in ("/health", "/") else "POST"
        raw = _request(method, f"{path}?case={case}", headers, None if method == "GET" else body,
                       framing="chunked" if rng.random() < 0.1 else "length")  # fmt: skip
        return Case(case, Listener.WHISPER, f"whisper {method} {path}", raw)

    # -- control ---------------------------------------------------------------------------

    def control(self, case: str) -> Case:
        rng = self.rng
        path = rng.choice(["/gate/v1/status", "/gate/v1/events", "/metrics", "/gate/v1/health",
                           "/gate/v1/leases", "/", "/gate/v1/nope"])  # fmt: skip
        headers = ["Host: " + rng.choice(["localhost", "127.0.0.1:9411", "evil.example", "x"])]
        if rng.random() < 0.3:
            headers.append(
                "Authorization: Bearer " + rng.choice(["ops-token", "nope", "\udcff", "\u20ac"])
            )
        method = rng.choice(["GET", "GET", "POST", "DELETE"])
        body = b"{}" if method == "POST" else None
        raw = _request(method, f"{path}?case={case}", headers, body)
        return Case(case, Listener.CONTROL, f"control {method}", raw)
