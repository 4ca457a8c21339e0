"""Which Ollama requests demand VRAM, and how their keep_alive is rewritten."""

from __future__ import annotations

import json

import pytest

from gpugate.config.model import (
    Address,
    Consumer,
    ModelOverride,
    Residency,
    Upstream,
)
from gpugate.core.classes import PriorityClass, ResidencyPolicy
from gpugate.runtimes.base import ApiFamily, RouteKind
from gpugate.runtimes.ollama.adapter import normalize_model, ollama_runtime, options_key

CONSUMER = Consumer(
    name="ollama",
    runtime="ollama",
    listen=Address("0.0.0.0", 11434),
    upstream=Upstream("http", "127.0.0.1", 11435),
    residency=Residency(ResidencyPolicy.KEEP_WARM, 900.0),
    models=(
        ModelOverride(
            "bge-m3",
            priority=PriorityClass.BACKGROUND,
            residency=Residency(ResidencyPolicy.KEEP_WARM, 901.0),
        ),
        ModelOverride("whisperish", residency=Residency(ResidencyPolicy.ALWAYS_WARM)),
        ModelOverride("flux", residency=Residency(ResidencyPolicy.LOAD_ON_DEMAND)),
    ),
)
READING = ollama_runtime(CONSUMER).reading


def classify(path, body, method="POST", content_type="application/json"):
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    return READING.classify(method, path, raw, content_type)


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/api/tags"),
        ("GET", "/api/ps"),
        ("POST", "/api/show"),
        ("POST", "/api/pull"),
        ("GET", "/"),
        ("GET", "/v1/models"),
        ("POST", "/api/create"),
        ("DELETE", "/api/delete"),
        ("POST", "/api/copy"),
        ("GET", "/api/version"),
    ],
)
def test_routes_that_cannot_load_pass_untouched(method, path):
    assert not READING.wants_body(method, path)
    assert READING.classify(method, path, None, "").kind is RouteKind.PASS


@pytest.mark.parametrize(
    "path",
    [
        "/api/generate",
        "/api/chat",
        "/api/embed",
        "/api/embeddings",
        "/v1/chat/completions",
        "/v1/completions",
        "/v1/embeddings",
        "/v1/responses",
        "/v1/messages",
    ],
)
def test_load_routes_demand_a_lease(path):
    # Every route's own minimum: /v1/chat/completions refuses a message without content
    # (openai.go FromChatRequest), /v1/messages a missing max_tokens (middleware/anthropic.go).
    body = {
        "model": "gemma3:12b",
        "prompt": "x",
        "messages": [{"role": "user", "content": "x"}],
        "input": "x",
        "max_tokens": 16,
    }
    result = classify(path, body)
    assert result.kind is RouteKind.DEMAND
    assert result.model == "gemma3:12b"
    assert result.api is (ApiFamily.OPENAI if path.startswith("/v1") else ApiFamily.OLLAMA)


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/api/generate", {"model": "m", "keep_alive": 0}),
        ("/api/generate", {"model": "m", "prompt": "", "keep_alive": "0s"}),
        ("/api/chat", {"model": "m", "messages": [], "keep_alive": 0.0}),
        ("/api/chat", {"model": "m", "keep_alive": "0"}),
    ],
)
def test_the_unload_shortcut_is_recognised(path, body):
    result = classify(path, body)
    assert result.kind is RouteKind.UNLOAD
    assert result.model == "m:latest"


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/api/embed", {"model": "m", "input": [], "keep_alive": 0}),  # loads, then expires
        ("/api/generate", {"model": "m", "prompt": "hi", "keep_alive": 0}),
        ("/api/generate", {"model": "m"}),  # an empty prompt loads
    ],
)
def test_zero_keep_alive_with_work_still_loads(path, body):
    assert classify(path, body).kind is RouteKind.DEMAND


@pytest.mark.parametrize(
    "body",
    [
        b"",
        b"{",
        b"[1, 2]",
        b'"x"',
        json.dumps({"prompt": "no model"}).encode(),
        json.dumps({"model": ""}).encode(),
        json.dumps({"model": 3}).encode(),
    ],
)
def test_bodies_ollama_refuses_are_passed_for_ollama_to_refuse(body):
    assert classify("/api/generate", body).kind is RouteKind.PASS


def test_cloud_models_and_empty_v1_chat_pass():
    assert classify("/api/chat", {"model": "gpt-oss:20b:cloud"}).kind is RouteKind.PASS
    assert classify("/api/chat", {"model": "gpt-oss:120b-cloud"}).kind is RouteKind.PASS
    assert classify("/v1/chat/completions", {"model": "m", "messages": []}).kind is RouteKind.PASS


def test_keep_alive_is_capped_and_the_rest_of_the_body_kept():
    body = {
        "model": "gemma3:12b",
        "prompt": "é",
        "keep_alive": "24h",
        "options": {"seed": 1},
        "_debug_render_only": False,
        "num": 1.5e3,
    }
    result = classify("/api/generate", body)
    assert result.body is not None
    sent = json.loads(result.body)
    assert sent == {**body, "keep_alive": 900}
    assert list(sent) == list(body)
    assert result.idle_ttl == 900.0 and result.sets_ttl


def test_a_shorter_keep_alive_is_forwarded_byte_for_byte():
    raw = b'{"model":"gemma3:12b","prompt":"x","keep_alive":"2m"}'
    result = classify("/api/generate", raw)
    assert result.body is None  # the original bytes go up unchanged
    assert result.idle_ttl == 120.0


def test_absent_keep_alive_gets_the_policy_value():
    result = classify("/api/embed", {"model": "bge-m3", "input": "x"})
    assert json.loads(result.body)["keep_alive"] == 901


def test_per_policy_values():
    warm = classify("/api/generate", {"model": "whisperish", "keep_alive": "1h", "prompt": "x"})
    assert warm.body is None and warm.idle_ttl == 3600.0
    forever = classify("/api/generate", {"model": "whisperish", "prompt": "x"})
    assert json.loads(forever.body)["keep_alive"] == -1 and forever.idle_ttl is None
    demand = classify("/api/generate", {"model": "flux", "keep_alive": -1, "prompt": "x"})
    assert json.loads(demand.body)["keep_alive"] == 0 and demand.idle_ttl == 0.0


def test_malformed_keep_alive_goes_up_for_ollama_to_refuse():
    # Ollama's bind error comes before any load: it answers 400 in its own words.
    result = classify("/api/generate", {"model": "m", "prompt": "x", "keep_alive": "300"})
    assert result.kind is RouteKind.PASS and result.body is None


def test_v1_requests_take_the_policy_ttl_without_setting_it():
    result = classify("/v1/embeddings", {"model": "bge-m3", "input": "x", "keep_alive": 5})
    assert result.body is None and result.idle_ttl == 901.0 and not result.sets_ttl


def test_runner_options_make_the_lease_key():
    assert options_key({"num_ctx": 8192, "temperature": 0.2, "num_gpu": 20}) == (
        "num_ctx=8192,num_gpu=20"
    )
    assert options_key({"seed": 3}) == ""
    assert options_key(None) == ""
    result = classify("/api/chat", {"model": "m", "messages": [{}], "options": {"num_ctx": 4}})
    assert result.options_key == "num_ctx=4"


def test_multipart_transcription_model_is_read():
    boundary = "XyZ"
    body = (
        f'--{boundary}\r\nContent-Disposition: form-data; name="model"\r\n\r\nwhisper-large\r\n'
        f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="a.wav"\r\n'
        f"Content-Type: audio/wav\r\n\r\nRIFF....\r\n--{boundary}--\r\n"
    ).encode()
    result = READING.classify(
        "POST", "/v1/audio/transcriptions", body, f"multipart/form-data; boundary={boundary}"
    )
    assert result.kind is RouteKind.DEMAND and result.model == "whisper-large:latest"


def test_names():
    assert normalize_model("llama3.2") == "llama3.2:latest"
    assert normalize_model("hf.co/org/model:Q4_K_M") == "hf.co/org/model:q4_k_m"
    assert (
        normalize_model("registry.local:5000/team/model") == "registry.local:5000/team/model:latest"
    )
