"""The Ollama adapter tells Ollama's refusals once a model is loaded from a failed load."""

from __future__ import annotations

import json

import pytest

from gpugate.runtimes.base import RouteKind
from gpugate.runtimes.ollama.adapter import OllamaDemand
from gpugate.runtimes.ollama.afterload import AfterLoad
from tests.runtimes.test_ollama_adapter import READING

EXPECTED = '; expected "json" or a valid JSON Schema object'


def after_load(path: str, body: bytes) -> AfterLoad:
    classified = READING.classify("POST", path, body, "application/json")
    assert classified.kind is RouteKind.DEMAND, body
    assert isinstance(classified.reading, OllamaDemand)
    return classified.reading.after_load


def answer(message: str) -> bytes:
    return json.dumps({"error": message}).encode()


@pytest.mark.parametrize(
    ("member", "refusal"),
    [
        ('"yaml"', 'invalid format: "\\"yaml\\""' + EXPECTED),
        # %q of the member's bytes as sent: an escaped "json" is not "json"
        ('"\\u006Ason"', 'invalid format: "\\"\\\\u006Ason\\""' + EXPECTED),
        ("[1, 2]", 'invalid format: "[1, 2]"' + EXPECTED),
        ("1", 'invalid format: "1"' + EXPECTED),
        ('"json"', None),
        ('""', None),
        ("null", None),
        ('{"type": "object"}', None),
    ],
)
def test_the_format_refusal_is_predicted_word_for_word(member, refusal):
    found = after_load(
        "/api/chat", b'{"model":"m","messages":[],"format":' + member.encode() + b"}"
    )
    assert found.format_refusal == refusal
    if refusal is not None:
        assert found.refused(500, answer(refusal))
        assert not found.refused(500, answer(refusal + " "))
        assert not found.refused(502, answer(refusal))


def test_the_last_format_member_is_the_one_read():
    found = after_load("/api/generate", b'{"model":"m","format":"yaml","FORMAT":"json"}')
    assert found.format_refusal is None
    found = after_load("/api/generate", b'{"model":"m","format":"json","Format":"yaml"}')
    assert found.format_refusal is not None and '\\"yaml\\"' in found.format_refusal


def test_an_object_format_may_be_refused_as_a_schema():
    found = after_load("/api/generate", b'{"model":"m","prompt":"x","format":{"type":1}}')
    assert found.refused(500, answer("invalid JSON schema in format"))


@pytest.mark.parametrize(
    ("body", "own"),
    [
        (b'{"model":"m","prompt":"x","template":"{{"}', True),
        (b'{"model":"m","prompt":"x","template":""}', False),
        (b'{"model":"m","prompt":"x","template":"{{","raw":false}', True),
    ],
)
def test_a_template_error_counts_only_for_a_request_with_its_own_template(body, own):
    found = after_load("/api/generate", body)
    assert found.own_template is own
    assert found.refused(500, answer("template: :1: unclosed action")) is own
    assert found.refused(500, answer("undefined template specified")) is own


@pytest.mark.parametrize(
    "message",
    [
        "llama runner process has terminated: exit status 2",
        "model requires more system memory (9.0 GiB) than is available (4.0 GiB)",
        "invalid format",
    ],
)
def test_any_other_500_is_a_failed_load(message):
    found = after_load(
        "/api/generate", b'{"model":"m","prompt":"x","template":"{{","format":"yaml"}'
    )
    assert not found.refused(500, answer(message))
    assert not found.refused(500, b"not json")


def test_the_openai_routes_expect_no_such_refusal():
    found = after_load(
        "/v1/chat/completions", b'{"model":"m","messages":[{"role":"user","content":"x"}]}'
    )
    assert found == AfterLoad()
