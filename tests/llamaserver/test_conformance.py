"""What llama-server answers, asserted the same against the real binary and the simulator.

Every expected value here was observed from the real llama-server (llama-cpp-python 0.3.36's
llama.cpp, built by tests/llamaserver/build.sh) over the tiny models of gguf_models.py. Their
output text is random, so the tests assert shapes, field names, token counts and error texts.
The tiny vocabulary is byte-level: a prompt of N ASCII characters is BOS + 3 bytes of the `▁`
space prefix + N tokens, and the model only ever samples printable ASCII and never EOS, so
`n_predict: N` gives N tokens, N characters and `finish_reason: "length"`.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.llamaserver.conftest import (
    ROUTER_MODELS,
    LlamaServer,
    StartServer,
    pid_alive,
    router_args,
    wait_for,
)
from tests.llamaserver.gguf_models import BYTE_BASE

JSON_TYPE = "application/json; charset=utf-8"
SSE_TYPE = "text/event-stream"
CHAT = [{"role": "user", "content": "Hi"}]
# BOS + "▁" (3 bytes) + "Hello"; the ChatML prompt of CHAT is 52 bytes, so BOS + 3 + 52.
HELLO_TOKENS = 9
CHAT_PROMPT_TOKENS = 56
EMBD = 64
NOT_FOUND = {"error": {"message": "File Not Found", "type": "not_found_error", "code": 404}}
NO_EMBEDDINGS = "This server does not support embeddings. Start it with `--embeddings`"
NO_INFILL = (
    "Infill is not supported by this model: prefix token is missing. "
    "suffix token is missing. middle token is missing. "
)
BAD_JSON = b"{not json"
BAD_JSON_MESSAGE = (
    "[json.exception.parse_error.101] parse error at line 1, column 3: syntax error while "
    "parsing object key - invalid literal; last read: '{no'; expected string literal"
)


# --- helpers -----------------------------------------------------------------------------


def error_body(code: int, kind: str, message: str) -> dict[str, Any]:
    return {"error": {"code": code, "message": message, "type": kind}}


def assert_error(response: httpx.Response, code: int, kind: str, message: str) -> None:
    assert response.status_code == code, response.text
    assert response.headers["content-type"] == JSON_TYPE
    assert response.json() == error_body(code, kind, message)


def assert_not_found(response: httpx.Response) -> None:
    assert response.status_code == 404, response.text
    assert response.headers["content-type"] == JSON_TYPE
    assert response.json() == NOT_FOUND


def sse_events(response: httpx.Response, *, done: bool = True) -> list[dict[str, Any]]:
    """The events of an SSE body framed `data: {...}\\n\\n`, ending `data: [DONE]\\n\\n`."""
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == SSE_TYPE
    body = response.text
    assert body.endswith("\n\n")
    frames = body[: -len("\n\n")].split("\n\n")
    assert all(frame.startswith("data: ") for frame in frames), frames
    if done:
        assert frames[-1] == "data: [DONE]"
        frames = frames[:-1]
    assert "data: [DONE]" not in frames
    return [json.loads(frame[len("data: ") :]) for frame in frames]


def printable(text: str) -> bool:
    return all(" " <= ch <= "~" for ch in text)


def model_statuses(client: httpx.Client) -> dict[str, str]:
    response = client.get("/models")
    assert response.status_code == 200
    return {m["id"]: m["status"]["value"] for m in response.json()["data"]}


def wait_status(client: httpx.Client, name: str, want: str) -> list[str]:
    """Poll GET /models until `name` has status `want`; the statuses seen on the way."""
    seen: list[str] = []

    def reached() -> bool:
        status = model_statuses(client)[name]
        if not seen or seen[-1] != status:
            seen.append(status)
        return status == want

    wait_for(reached, 60.0, f"model {name} to become {want}")
    return seen


def chat(client: httpx.Client, model: str | None = None, **extra: Any) -> httpx.Response:
    body: dict[str, Any] = {"messages": CHAT, "max_tokens": 3, **extra}
    if model is not None:
        body["model"] = model
    return client.post("/v1/chat/completions", json=body)


@pytest.fixture
def single(single_server: LlamaServer) -> httpx.Client:
    with single_server.client() as client:
        yield client


@pytest.fixture
def plain(plain_server: LlamaServer) -> httpx.Client:
    with plain_server.client() as client:
        yield client


@pytest.fixture
def router(router_server: LlamaServer) -> httpx.Client:
    with router_server.client() as client:
        yield client


# --- single mode: the routes -------------------------------------------------------------


@pytest.mark.parametrize("path", ["/health", "/v1/health"])
def test_health(single: httpx.Client, path: str) -> None:
    response = single.get(path)
    assert response.status_code == 200
    assert response.headers["content-type"] == JSON_TYPE
    assert response.headers["server"] == "llama.cpp"
    assert response.json() == {"status": "ok"}


@pytest.mark.parametrize("path", ["/v1/models", "/models"])
def test_models_lists_the_one_model_by_its_path(
    single: httpx.Client, single_server: LlamaServer, model_files: dict[str, Path], path: str
) -> None:
    response = single.get(path)
    assert response.status_code == 200
    assert response.headers["content-type"] == JSON_TYPE
    body = response.json()
    assert set(body) == {"models", "object", "data"}
    assert body["object"] == "list"
    model_path = str(model_files["full"])
    [ollama_style] = body["models"]
    assert ollama_style["name"] == ollama_style["model"] == model_path
    assert ollama_style["capabilities"] == ["completion"]
    assert ollama_style["details"]["format"] == "gguf"
    [entry] = body["data"]
    assert entry["id"] == model_path
    assert entry["aliases"] == [model_path]
    assert entry["object"] == "model"
    assert entry["owned_by"] == "llamacpp"
    assert isinstance(entry["created"], int)
    meta = entry["meta"]
    assert {k: meta[k] for k in ("vocab_type", "n_vocab", "n_ctx", "n_ctx_train", "n_embd")} == {
        "vocab_type": 1,  # SPM
        "n_vocab": 262,  # 3 special + 256 bytes + 3 FIM
        "n_ctx": 512,
        "n_ctx_train": 512,
        "n_embd": EMBD,
    }
    assert meta["ftype"] == "F16"
    assert meta["n_params"] > 0 and meta["size"] > 0


def test_completion(single: httpx.Client, model_files: dict[str, Path]) -> None:
    response = single.post("/completion", json={"prompt": "Hello", "n_predict": 5})
    assert response.status_code == 200
    assert response.headers["content-type"] == JSON_TYPE
    body = response.json()
    assert len(body["content"]) == 5 and printable(body["content"])
    assert body["tokens_predicted"] == 5
    assert body["tokens_evaluated"] == HELLO_TOKENS
    assert body["stop"] is True
    assert body["stop_type"] == "limit"
    assert body["stopping_word"] == ""
    assert body["truncated"] is False
    assert body["model"] == str(model_files["full"])
    assert body["prompt"] == "<s>▁Hello"
    assert body["generation_settings"]["n_predict"] == 5
    assert {"index", "id_slot", "tokens", "tokens_cached", "timings"} <= set(body)
    assert {"prompt_n", "predicted_n", "predicted_ms"} <= set(body["timings"])
    assert body["timings"]["predicted_n"] == 5


def test_completion_stream(single: httpx.Client) -> None:
    response = single.post("/completion", json={"prompt": "Hello", "n_predict": 3, "stream": True})
    events = sse_events(response, done=False)
    *tokens, last = events
    assert len(tokens) == 3
    for i, event in enumerate(tokens, 1):
        assert event["stop"] is False
        assert event["tokens_predicted"] == i
        assert event["tokens_evaluated"] == HELLO_TOKENS
        assert len(event["content"]) == 1 and printable(event["content"])
        [token] = event["tokens"]
        assert token == BYTE_BASE + ord(event["content"])
    assert last["stop"] is True
    assert last["content"] == ""
    assert last["tokens_predicted"] == 3
    assert last["stop_type"] == "limit"
    assert "timings" in last and "generation_settings" in last


def test_oai_completion(single: httpx.Client, model_files: dict[str, Path]) -> None:
    response = single.post("/v1/completions", json={"prompt": "Hello", "max_tokens": 4})
    assert response.status_code == 200
    assert response.headers["content-type"] == JSON_TYPE
    body = response.json()
    assert body["object"] == "text_completion"
    assert body["id"].startswith("chatcmpl-")
    assert body["model"] == str(model_files["full"])
    assert isinstance(body["created"], int) and body["system_fingerprint"]
    [choice] = body["choices"]
    assert choice["index"] == 0
    assert choice["finish_reason"] == "length"
    assert choice["logprobs"] is None
    assert len(choice["text"]) == 4 and printable(choice["text"])
    usage = body["usage"]
    assert (usage["prompt_tokens"], usage["completion_tokens"], usage["total_tokens"]) == (
        HELLO_TOKENS,
        4,
        HELLO_TOKENS + 4,
    )


def test_oai_completion_stream(single: httpx.Client) -> None:
    response = single.post(
        "/v1/completions", json={"prompt": "Hello", "max_tokens": 3, "stream": True}
    )
    *chunks, last = sse_events(response)
    assert len(chunks) == 3
    assert len({c["id"] for c in [*chunks, last]}) == 1
    for chunk in chunks:
        assert chunk["object"] == "text_completion"
        [choice] = chunk["choices"]
        assert choice["finish_reason"] is None
        assert len(choice["text"]) == 1
        assert "usage" not in chunk
    [choice] = last["choices"]
    assert (choice["text"], choice["finish_reason"]) == ("", "length")
    assert last["usage"]["completion_tokens"] == 3
    assert last["usage"]["prompt_tokens"] == HELLO_TOKENS


def test_chat_completion(single: httpx.Client, model_files: dict[str, Path]) -> None:
    response = chat(single, max_tokens=4)
    assert response.status_code == 200
    assert response.headers["content-type"] == JSON_TYPE
    body = response.json()
    assert body["object"] == "chat.completion"
    assert body["id"].startswith("chatcmpl-")
    assert body["model"] == str(model_files["full"])
    [choice] = body["choices"]
    assert choice["finish_reason"] == "length"
    assert choice["index"] == 0
    assert choice["message"]["role"] == "assistant"
    assert len(choice["message"]["content"]) == 4
    usage = body["usage"]
    assert (usage["prompt_tokens"], usage["completion_tokens"], usage["total_tokens"]) == (
        CHAT_PROMPT_TOKENS,
        4,
        CHAT_PROMPT_TOKENS + 4,
    )
    assert "cached_tokens" in usage["prompt_tokens_details"]
    assert body["timings"]["predicted_n"] == 4


def test_chat_completion_stream(single: httpx.Client) -> None:
    first, *chunks, last = sse_events(chat(single, stream=True))
    assert len({c["id"] for c in [first, *chunks, last]}) == 1
    assert all(c["object"] == "chat.completion.chunk" for c in [first, *chunks, last])
    assert first["choices"] == [
        {"finish_reason": None, "index": 0, "delta": {"role": "assistant", "content": None}}
    ]
    assert len(chunks) == 3
    for chunk in chunks:
        [choice] = chunk["choices"]
        assert choice["finish_reason"] is None
        assert set(choice["delta"]) == {"content"} and len(choice["delta"]["content"]) == 1
    assert last["choices"] == [{"finish_reason": "length", "index": 0, "delta": {}}]
    assert "usage" not in last  # only with stream_options.include_usage
    assert last["timings"]["predicted_n"] == 3


def test_chat_completion_stream_with_usage(single: httpx.Client) -> None:
    events = sse_events(chat(single, stream=True, stream_options={"include_usage": True}))
    usage = events[-1]["usage"]
    assert (usage["prompt_tokens"], usage["completion_tokens"]) == (CHAT_PROMPT_TOKENS, 3)
    assert all("usage" not in e for e in events[:-1])


def test_single_mode_ignores_the_model_name(
    single: httpx.Client, model_files: dict[str, Path]
) -> None:
    response = chat(single, "no-such-model")
    assert response.status_code == 200
    assert response.json()["model"] == str(model_files["full"])


def test_oai_embeddings(single: httpx.Client, model_files: dict[str, Path]) -> None:
    response = single.post("/v1/embeddings", json={"input": ["Hello", "World!"]})
    assert response.status_code == 200
    assert response.headers["content-type"] == JSON_TYPE
    body = response.json()
    assert body["object"] == "list"
    assert body["model"] == str(model_files["full"])
    assert body["usage"] == {"prompt_tokens": HELLO_TOKENS + 10, "total_tokens": HELLO_TOKENS + 10}
    assert [(d["index"], d["object"]) for d in body["data"]] == [(0, "embedding"), (1, "embedding")]
    for item in body["data"]:
        assert len(item["embedding"]) == EMBD
        assert sum(x * x for x in item["embedding"]) == pytest.approx(1.0, abs=1e-3)
    assert body["data"][0]["embedding"] != body["data"][1]["embedding"]


def test_legacy_embedding_matches_oai(single: httpx.Client) -> None:
    legacy = single.post("/embedding", json={"content": "Hello"})
    assert legacy.status_code == 200
    assert legacy.headers["content-type"] == JSON_TYPE
    [item] = legacy.json()
    assert set(item) == {"index", "embedding"} and item["index"] == 0
    [vector] = item["embedding"]  # one vector per pooled sequence
    oai = single.post("/v1/embeddings", json={"input": "Hello"}).json()
    assert oai["usage"]["prompt_tokens"] == HELLO_TOKENS
    assert vector == pytest.approx(oai["data"][0]["embedding"], abs=1e-6)


def test_infill(single: httpx.Client) -> None:
    body = {"input_prefix": "def f(", "input_suffix": "):", "n_predict": 3}
    response = single.post("/infill", json=body)
    assert response.status_code == 200
    result = response.json()
    assert len(result["content"]) == 3
    assert result["tokens_predicted"] == 3
    assert result["stop_type"] == "limit"
    assert result["prompt"] == "<s><fim_prefix>▁def▁f(<fim_suffix>▁):<fim_middle>"


def test_tokenize_and_detokenize(single: httpx.Client) -> None:
    response = single.post("/tokenize", json={"content": "Hello"})
    assert response.status_code == 200
    assert response.headers["content-type"] == JSON_TYPE
    space = [BYTE_BASE + b for b in "▁".encode()]  # the SPM space prefix, as bytes
    assert response.json() == {"tokens": space + [BYTE_BASE + b for b in b"Hello"]}
    pieces = single.post("/tokenize", json={"content": "Hi", "with_pieces": True}).json()
    assert pieces == {
        "tokens": [
            {"id": space[0], "piece": [0xE2]},  # bytes that are not UTF-8 alone: a list
            {"id": space[1], "piece": [0x96]},
            {"id": space[2], "piece": [0x81]},
            {"id": BYTE_BASE + ord("H"), "piece": "H"},
            {"id": BYTE_BASE + ord("i"), "piece": "i"},
        ]
    }
    detok = single.post("/detokenize", json={"tokens": [BYTE_BASE + b for b in b"Hi"]})
    assert detok.status_code == 200
    assert detok.json() == {"content": "Hi"}


# --- single mode: errors -----------------------------------------------------------------


@pytest.mark.parametrize("path", ["/completion", "/v1/chat/completions", "/v1/completions"])
def test_bad_json_is_a_500_server_error(single: httpx.Client, path: str) -> None:
    response = single.post(path, content=BAD_JSON, headers={"content-type": "application/json"})
    assert_error(response, 500, "server_error", BAD_JSON_MESSAGE)


@pytest.mark.parametrize(
    ("path", "body", "message"),
    [
        ("/v1/chat/completions", {}, "'messages' is required"),
        ("/v1/chat/completions", {"messages": "x"}, "Expected 'messages' to be an array"),
        ("/completion", {}, "[json.exception.out_of_range.403] key 'prompt' not found"),
    ],
)
def test_invalid_request(single: httpx.Client, path: str, body: dict, message: str) -> None:
    assert_error(single.post(path, json=body), 400, "invalid_request_error", message)


@pytest.mark.parametrize(("method", "path"), [("GET", "/nope"), ("POST", "/nope")])
def test_unknown_route(single: httpx.Client, method: str, path: str) -> None:
    assert_not_found(single.request(method, path, json={} if method == "POST" else None))


def test_wrong_method_is_not_found(single: httpx.Client) -> None:
    assert_not_found(single.get("/completion"))


def test_prompt_longer_than_the_context(single: httpx.Client) -> None:
    response = single.post("/v1/completions", json={"prompt": "x" * 2000, "max_tokens": 2})
    assert response.status_code == 400
    assert response.json() == {
        "error": {
            "code": 400,
            "message": "request (2004 tokens) exceeds the available context size (512 tokens), "
            "try increasing it",
            "type": "exceed_context_size_error",
            "n_prompt_tokens": 2004,
            "n_ctx": 512,
        }
    }


@pytest.mark.parametrize("path", ["/v1/embeddings", "/embedding"])
def test_embeddings_need_the_flag(plain: httpx.Client, path: str) -> None:
    body = {"input": "Hello"} if path.startswith("/v1") else {"content": "Hello"}
    assert_error(plain.post(path, json=body), 501, "not_supported_error", NO_EMBEDDINGS)


def test_infill_needs_fim_tokens(plain: httpx.Client) -> None:
    response = plain.post("/infill", json={"input_prefix": "a", "input_suffix": "b"})
    assert_error(response, 501, "not_supported_error", NO_INFILL)


# --- the official openai client ----------------------------------------------------------


@pytest.fixture
def oai(single_server: LlamaServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{single_server.url}/v1", api_key="none", max_retries=0)


def test_openai_chat(oai: openai.OpenAI) -> None:
    result = oai.chat.completions.create(model="tiny", messages=CHAT, max_tokens=4)
    [choice] = result.choices
    assert choice.finish_reason == "length"
    assert choice.message.role == "assistant"
    assert len(choice.message.content or "") == 4
    assert result.usage is not None
    assert (result.usage.prompt_tokens, result.usage.completion_tokens) == (CHAT_PROMPT_TOKENS, 4)


def test_openai_chat_stream(oai: openai.OpenAI) -> None:
    stream = oai.chat.completions.create(model="tiny", messages=CHAT, max_tokens=5, stream=True)
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert len(text) == 5
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-1].choices[0].finish_reason == "length"


def test_openai_completion(oai: openai.OpenAI) -> None:
    result = oai.completions.create(model="tiny", prompt="Hello", max_tokens=4)
    assert len(result.choices[0].text) == 4
    assert result.choices[0].finish_reason == "length"
    assert result.usage is not None and result.usage.prompt_tokens == HELLO_TOKENS


def test_openai_embeddings_base64(oai: openai.OpenAI) -> None:
    # the client asks for base64 by default and decodes it
    result = oai.embeddings.create(model="tiny", input=["Hello", "World!"])
    assert [len(d.embedding) for d in result.data] == [EMBD, EMBD]
    assert result.usage.prompt_tokens == HELLO_TOKENS + 10
    floats = oai.embeddings.create(model="tiny", input="Hello", encoding_format="float")
    assert floats.data[0].embedding == pytest.approx(result.data[0].embedding, abs=1e-6)


def test_openai_error(oai: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        oai.completions.create(model="tiny", prompt="x" * 2000, max_tokens=2)
    assert caught.value.status_code == 400
    assert caught.value.type == "exceed_context_size_error"
    assert caught.value.code == "400"


def test_openai_not_supported_is_an_internal_server_error(plain_server: LlamaServer) -> None:
    client = openai.OpenAI(base_url=f"{plain_server.url}/v1", api_key="none", max_retries=0)
    with pytest.raises(openai.InternalServerError) as caught:
        client.embeddings.create(model="tiny", input="Hello")
    assert caught.value.status_code == 501
    assert caught.value.message == f"Error code: 501 - {NO_EMBEDDINGS}"
    assert caught.value.type == "not_supported_error"


# --- router mode -------------------------------------------------------------------------


def test_router_lists_the_models_dir_unloaded(
    router: httpx.Client, models_dir: Path, router_server: LlamaServer
) -> None:
    response = router.get("/models")
    assert response.status_code == 200
    assert response.headers["content-type"] == JSON_TYPE
    body = response.json()
    assert set(body) == {"data", "object"} and body["object"] == "list"
    assert [m["id"] for m in body["data"]] == list(ROUTER_MODELS)
    for entry in body["data"]:
        assert entry["object"] == "model"
        assert entry["owned_by"] == "llamacpp"
        assert entry["source"] == "models_dir"
        assert entry["aliases"] == [] and entry["tags"] == []
        assert entry["status"]["value"] == "unloaded"
        assert "meta" not in entry
        args = entry["status"]["args"]
        assert args[args.index("--model") + 1] == str(models_dir / f"{entry['id']}.gguf")
        assert args[args.index("--alias") + 1] == entry["id"]
        assert args[args.index("--port") + 1] == "0"
        assert entry["architecture"] == {
            "input_modalities": ["text"],
            "output_modalities": ["text"],
        }
    v1 = router.get("/v1/models").json()
    assert [m["id"] for m in v1["data"]] == list(ROUTER_MODELS)
    assert router_server.children() == []


def test_router_health_and_props(router: httpx.Client) -> None:
    assert router.get("/health").json() == {"status": "ok"}
    props = router.get("/props").json()
    assert props["role"] == "router"
    assert props["max_instances"] == 2
    assert props["models_autoload"] is True


def test_router_load_and_unload(router: httpx.Client, router_server: LlamaServer) -> None:
    response = router.post("/models/load", json={"model": "alpha"})
    assert response.status_code == 200
    assert response.json() == {"success": True}
    seen = wait_status(router, "alpha", "loaded")
    assert set(seen) <= {"loading", "loaded"}
    entry = next(m for m in router.get("/models").json()["data"] if m["id"] == "alpha")
    assert entry["meta"]["n_vocab"] == 259 and entry["meta"]["n_ctx"] == 512
    assert int(entry["status"]["args"][entry["status"]["args"].index("--port") + 1]) > 0
    assert len(router_server.children()) == 1

    response = router.post("/models/unload", json={"model": "alpha"})
    assert response.status_code == 200
    assert response.json() == {"success": True}
    wait_status(router, "alpha", "unloaded")
    wait_for(lambda: router_server.children() == [], 10.0, "the model's process to exit")


def test_router_load_errors(router: httpx.Client) -> None:
    assert router.post("/models/load", json={"model": "alpha"}).status_code == 200
    wait_status(router, "alpha", "loaded")
    already = router.post("/models/load", json={"model": "alpha"})
    assert_error(already, 400, "invalid_request_error", "model is already running")
    # the handler answers 404 "model is not found"; cpp-httplib's error handler replaces
    # the body of every 404 with its own (server-http.cpp)
    assert_not_found(router.post("/models/load", json={"model": "nope"}))
    assert_not_found(router.post("/models/load", json={}))


def test_router_unload_errors(router: httpx.Client) -> None:
    not_loaded = router.post("/models/unload", json={"model": "beta"})
    assert_error(not_loaded, 400, "invalid_request_error", "model is not running")
    unknown = router.post("/models/unload", json={"model": "nope"})
    assert_error(unknown, 400, "invalid_request_error", "model is not found")


@pytest.mark.parametrize("path", ["/completion", "/v1/chat/completions", "/tokenize"])
def test_router_needs_a_known_model(router: httpx.Client, path: str) -> None:
    body = {"prompt": "Hi", "messages": CHAT, "content": "Hi", "max_tokens": 2}
    missing = router.post(path, json=body)
    assert_error(missing, 400, "invalid_request_error", "model name is missing from the request")
    unknown = router.post(path, json={**body, "model": "nope"})
    assert_error(unknown, 400, "invalid_request_error", "model 'nope' not found")
    assert set(model_statuses(router).values()) == {"unloaded"}


def test_router_bad_json(router: httpx.Client) -> None:
    for path in ("/completion", "/models/load"):
        response = router.post(path, content=b"{bad", headers={"content-type": "application/json"})
        message = BAD_JSON_MESSAGE.replace("column 3", "column 2").replace("'{no'", "'{b'")
        assert_error(response, 500, "server_error", message)


def test_router_unknown_route(router: httpx.Client) -> None:
    assert_not_found(router.get("/nope"))


def test_router_autoloads_on_a_request(router: httpx.Client, router_server: LlamaServer) -> None:
    response = chat(router, "beta", max_tokens=2)
    assert response.status_code == 200
    assert response.headers["content-type"] == JSON_TYPE
    body = response.json()
    assert body["model"] == "beta"  # the alias, not the path
    assert body["usage"]["prompt_tokens"] == CHAT_PROMPT_TOKENS
    assert body["usage"]["completion_tokens"] == 2
    # the request waited for the load
    assert model_statuses(router) == {"alpha": "unloaded", "beta": "loaded", "gamma": "unloaded"}
    assert len(router_server.children()) == 1


def test_router_without_autoload_refuses_unloaded_models(
    starter: StartServer, models_dir: Path
) -> None:
    server = starter(router_args(models_dir, "--no-models-autoload"))
    with server.client() as client:
        assert client.get("/props").json()["models_autoload"] is False
        refused = chat(client, "beta")
        assert_error(refused, 400, "invalid_request_error", "model is not loaded")
        assert model_statuses(client)["beta"] == "unloaded"
        assert client.post("/models/load", json={"model": "beta"}).status_code == 200
        wait_status(client, "beta", "loaded")
        assert chat(client, "beta").status_code == 200


def test_router_streams_through(router: httpx.Client) -> None:
    first, *chunks, last = sse_events(chat(router, "gamma", stream=True))
    assert first["model"] == "gamma"
    assert len(chunks) == 3
    assert last["choices"][0]["finish_reason"] == "length"


def test_router_proxies_tokenize_and_errors(router: httpx.Client) -> None:
    response = router.post("/tokenize", json={"model": "alpha", "content": "Hi"})
    assert response.status_code == 200
    assert response.json() == {"tokens": [229, 153, 132, BYTE_BASE + 72, BYTE_BASE + 105]}
    embeddings = router.post("/v1/embeddings", json={"model": "alpha", "input": "Hi"})
    assert_error(embeddings, 501, "not_supported_error", NO_EMBEDDINGS)


def test_models_max_unloads_the_least_recently_used(
    router: httpx.Client, router_server: LlamaServer
) -> None:
    assert router.post("/models/load", json={"model": "alpha"}).status_code == 200
    wait_status(router, "alpha", "loaded")
    assert chat(router, "beta", max_tokens=1).status_code == 200
    assert model_statuses(router) == {"alpha": "loaded", "beta": "loaded", "gamma": "unloaded"}
    # a third model: the least recently used one (alpha) is stopped before gamma starts
    response = router.post(
        "/v1/completions", json={"model": "gamma", "prompt": "Hi", "max_tokens": 2}
    )
    assert response.status_code == 200
    assert response.json()["usage"] == {
        "completion_tokens": 2,
        "prompt_tokens": 6,
        "total_tokens": 8,
        "prompt_tokens_details": {"cached_tokens": 0},
    }
    assert model_statuses(router) == {"alpha": "unloaded", "beta": "loaded", "gamma": "loaded"}
    assert len(router_server.children()) == 2
    # an explicit load evicts too: beta is now the least recently used
    assert router.post("/models/load", json={"model": "alpha"}).json() == {"success": True}
    wait_status(router, "alpha", "loaded")
    assert model_statuses(router) == {"alpha": "loaded", "beta": "unloaded", "gamma": "loaded"}
    wait_for(lambda: len(router_server.children()) == 2, 10.0, "two model processes")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
def test_router_children_end_with_the_router(
    starter: StartServer, models_dir: Path, sig: signal.Signals
) -> None:
    server = starter(router_args(models_dir))
    with server.client() as client:
        for name in ("alpha", "beta"):
            assert chat(client, name, max_tokens=1).status_code == 200
    children = server.children()
    assert len(children) == 2
    os.kill(server.pid, sig)
    code = server.proc.wait(10)
    assert code == (0 if sig == signal.SIGTERM else -signal.SIGKILL)
    # SIGTERM: the router tells each child to exit; SIGKILL: each child sees EOF on the
    # stdin pipe from its dead router and exits by itself
    started = time.monotonic()
    wait_for(lambda: not any(pid_alive(p) for p in children), 10.0, "the children to exit")
    assert time.monotonic() - started < 5.0
