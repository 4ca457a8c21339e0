"""Each demand route read against its own Go request type (Ollama v0.24.0)."""

from __future__ import annotations

import pytest

from gpugate.runtimes.base import RouteKind
from gpugate.runtimes.ollama.adapter import OllamaDemand
from gpugate.runtimes.ollama.needs import ModelFacts, refused
from tests.runtimes.test_ollama_adapter import READING

_MSG = b'"messages":[{"role":"user","content":"hi"}]'


def kind(path: str, body: bytes, content_type: str = "application/json", query: str = ""):
    return READING.classify("POST", path, body, content_type, query=query)


@pytest.mark.parametrize(
    "path,body",
    [
        ("/v1/completions", b'{"model":"m","prompt":"hi","messages":1}'),
        ("/v1/embeddings", b'{"model":"m","input":"hi","stream":"yes"}'),
        ("/v1/chat/completions", b'{"model":"m",' + _MSG + b',"prompt":1}'),
        ("/api/embed", b'{"model":"m","input":["a"],"messages":1}'),
        ("/api/generate", b'{"model":" tiny","prompt":"x"}'),
        ("/api/generate", b'{"model":"tiny\\n","prompt":"x"}'),
        ("/api/generate", b'{"model":"\\ttiny","prompt":"x"}'),
        ("/api/chat", b'{"model":" tiny:latest ",' + _MSG + b"}"),
        ("/api/generate", b'{"model":"tiny:local","prompt":"x"}'),
        ("/api/generate", b'{"model":"m","prompt":"x","keep_alive":"2562047h"}'),
        ("/api/generate", b'{"model":"m","prompt":"x","keep_alive":1e300}'),
        ("/api/chat", b'{"model":"m","messages":[{"role":"u","images":["YQ=="]}]}'),
        ("/api/generate", b'{"model":"m","x":' + b"[" * 9999 + b"]" * 9999 + b"}"),
    ],
)
def test_ollama_loads_these(path, body):
    result = kind(path, body)
    assert result.kind is RouteKind.DEMAND
    assert result.model in {"m:latest", "tiny:latest"}


@pytest.mark.parametrize(
    "path,body",
    [
        ("/api/generate", b'{"model":"m","prompt":"x","keep_alive":"9999999h"}'),
        ("/api/generate", b'{"model":"m","prompt":"x","keep_alive":"2562048h"}'),
        ("/api/generate", b'{"model":"m","prompt":"x","keep_alive":1e400}'),
        ("/api/generate", b'{"model":"m","x":' + b"[" * 10000 + b"]" * 10000 + b"}"),
        ("/api/generate", b'{"model":"m","top_logprobs":21}'),
        ("/api/generate", b'{"model":"m","think":"very"}'),
        ("/api/generate", b'{"model":"m","context":[1.5]}'),
        ("/api/chat", b'{"model":"m","messages":[{"role":1}]}'),
        ("/api/chat", b'{"model":"m","messages":[{"role":"u","images":["YQ"]}]}'),
        ("/api/chat", b'{"model":"m","messages":[{"tool_calls":[{"function":{"arguments":1}}]}]}'),
        (
            "/api/chat",
            b'{"model":"m","tools":[{"function":{"parameters":{"properties":{"a":{"type":1}}}}}]}',
        ),
        ("/api/embed", b'{"model":"m","input":[1]}'),
        ("/v1/chat/completions", b'{"model":"m","messages":[]}'),
        ("/v1/chat/completions", b'{"model":"m","messages":[{"role":"user"}]}'),
        ("/v1/chat/completions", b'{"model":"m",' + _MSG + b',"reasoning_effort":"x"}'),
        ("/v1/chat/completions", b'{"model":"m",' + _MSG + b',"top_logprobs":30}'),
        ("/v1/chat/completions", b'{"model":"x:cloud","Model":"m",' + _MSG + b"}"),
        ("/v1/completions", b'{"model":"m","stop":[1]}'),
        ("/v1/completions", b'{"model":"m","logprobs":21}'),
        ("/v1/completions", b'{"model":"m","top_p":1e39}'),
        ("/v1/embeddings", b'{"model":"m","input":[]}'),
        ("/v1/embeddings", b'{"model":"m","input":"x","encoding_format":"int8"}'),
        ("/api/generate", b'{"model":"m:local:cloud"}'),
    ],
)
def test_ollama_refuses_these_before_loading(path, body):
    assert kind(path, body).kind is RouteKind.PASS


@pytest.mark.parametrize(
    "body",
    [b'{"model":"m","raw":true,"system":"s"}', b'{"model":"m","options":{"num_ctx":"8"}}'],
)
def test_what_generate_refuses_only_for_a_model_that_is_not_an_image_model(body):
    # GenerateHandler hands an image model's request on before these checks (routes.go:368).
    classified = kind("/api/generate", body)
    assert classified.kind is RouteKind.DEMAND
    assert isinstance(classified.reading, OllamaDemand)
    needs = classified.reading.needs
    assert refused(needs, ModelFacts(frozenset({"completion"})))
    assert not refused(needs, ModelFacts(frozenset({"image"})))


def test_unload_shortcut_uses_gos_nanoseconds():
    assert kind("/api/generate", b'{"model":"m","keep_alive":1e-10}').kind is RouteKind.UNLOAD


_FORM = b'--B\r\nContent-Disposition: form-data; name="file"; filename="a.wav"\r\n\r\nRIFF\r\n'


def test_transcription_model_comes_from_the_query_first():
    ctype = "multipart/form-data; boundary=B"
    body = _FORM + b'--B\r\nContent-Disposition: form-data; name="model"\r\n\r\nother\r\n--B--\r\n'
    assert kind("/v1/audio/transcriptions", body, ctype, "model=tiny").model == "tiny:latest"
    assert kind("/v1/audio/transcriptions", body, ctype).model == "other:latest"
    bare = _FORM + b"--B--\r\n"
    assert kind("/v1/audio/transcriptions", bare, ctype).kind is RouteKind.PASS
    assert kind("/v1/audio/transcriptions", body, "application/json").kind is RouteKind.PASS
