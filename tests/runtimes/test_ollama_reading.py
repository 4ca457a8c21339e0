"""The adapter reads a body as Ollama's Go decoder does and rewrites only keep_alive."""

from __future__ import annotations

import pytest

from gpugate.runtimes.base import RouteKind
from tests.runtimes.test_ollama_adapter import READING


def classify(path: str, raw: bytes):
    return READING.classify("POST", path, raw, "application/json")


def test_a_null_keep_alive_is_unset_and_gets_the_policy_value():
    result = classify("/api/generate", b'{"model":"m","prompt":"x","keep_alive":null}')
    assert result.kind is RouteKind.DEMAND and result.idle_ttl == 900.0
    assert result.body == b'{"model":"m","prompt":"x","keep_alive":900}'


def test_a_null_keep_alive_with_an_empty_prompt_is_a_load_not_an_unload():
    result = classify("/api/generate", b'{"model":"m","keep_alive":null}')
    assert result.kind is RouteKind.DEMAND


@pytest.mark.parametrize(
    ("raw", "sent"),
    [
        (
            b'{"model":"m","prompt":"\\ud800 \xc3\xa9","keep_alive":"24h"}',
            b'{"model":"m","prompt":"\\ud800 \xc3\xa9","keep_alive":900}',
        ),
        (
            b'{ "model" : "m", "n": 1e400, "big": 1' + b"0" * 400 + b', "keep_alive" : "24h" }',
            b'{ "model" : "m", "n": 1e400, "big": 1' + b"0" * 400 + b', "keep_alive" : 900 }',
        ),
        (
            b'{"model":"m","prompt":"\xff\xfe"}',
            b'{"model":"m","prompt":"\xff\xfe","keep_alive":900}',
        ),
        (b'{"model":"m"} trailing', b'{"model":"m","keep_alive":900} trailing'),
    ],
)
def test_the_rewrite_splices_keep_alive_and_keeps_every_other_byte(raw, sent):
    result = classify("/api/generate", raw)
    assert result.kind is RouteKind.DEMAND
    assert result.body == sent


def test_keys_match_fields_case_insensitively_as_go_does():
    result = classify("/api/generate", b'{"Model":"m","PROMPT":"x"}')
    assert result.kind is RouteKind.DEMAND and result.model == "m:latest"
    assert result.body == b'{"Model":"m","PROMPT":"x","keep_alive":900}'


def test_duplicate_keep_alives_leave_one_capped_the_one_go_reads():
    raw = b'{"keep_alive":"1s", "model":"m","prompt":"x","KEEP_ALIVE":"24h"}'
    result = classify("/api/generate", raw)
    assert result.idle_ttl == 900.0
    assert result.body == b'{"model":"m","prompt":"x","KEEP_ALIVE":900}'


def test_the_last_keep_alive_wins_even_when_it_is_shorter_or_null():
    # U+212A KELVIN SIGN folds to K in Go's fold.go.
    raw = b'{"model":"m","keep_alive":"24h","prompt":"x","\\u212aeep_alive":"2m"}'
    result = classify("/api/generate", raw)
    assert result.idle_ttl == 120.0
    assert result.body == b'{"model":"m","prompt":"x","\\u212aeep_alive":"2m"}'
    raw = b'{"model":"m","keep_alive":"2m","prompt":"x","Keep_Alive":null}'
    result = classify("/api/generate", raw)
    assert result.idle_ttl == 900.0
    assert result.body == b'{"model":"m","prompt":"x","Keep_Alive":900}'


@pytest.mark.parametrize(
    ("path", "key"),
    [
        ("/api/generate", "\ufb06ream"),
        ("/api/generate", "\ufb05ream"),
        ("/api/generate", "keep_al\u0131ve"),
        ("/api/generate", "su\ufb03x"),
        ("/api/generate", "\u0131mages"),
        ("/api/chat", "me\u00dfages"),
    ],
)
def test_keys_python_upper_cases_to_a_field_match_none_in_go(path, key):
    # Go folds ß, ı and the ligatures to themselves (caseOrbit), not to SS, I, ST, FFI:
    # such a key is an unknown field that Go skips, whatever its value.
    raw = ('{"model":"m","prompt":"x","' + key + '":{}}').encode()
    result = classify(path, raw)
    assert result.kind is RouteKind.DEMAND and result.idle_ttl == 900.0
    assert result.body == raw[:-1] + b',"keep_alive":900}'


def test_an_unload_reads_the_folded_keys():
    result = classify("/api/chat", b'{"MODEL":"m","Keep_Alive":0}')
    assert result.kind is RouteKind.UNLOAD and result.model == "m:latest"


@pytest.mark.parametrize(
    "raw",
    [
        b'{"model":"m","prompt":"x","n":NaN}',
        b'{"model":"m","prompt":"x","n":Infinity}',
        b'{"model":"m","prompt":"x","n":-Infinity}',
        b'{"model":"m","prompt":"x","keep_alive":1e400}',
        b'{"model":"m","prompt":"x","options":{"temperature":1e400}}',
        b'{"model":"m","prompt":"x","keep_alive":"300"}',
        b'{"model":"m","prompt":"x","keep_alive":true}',
        b'{"model":"m","prompt":5}',
        b'{"model":"m","Stream":"yes"}',
        b'{"model":"m","prompt":"x",}',
        b'\xef\xbb\xbf{"model":"m"}',
        b'{"model":"m" "prompt":"x"}',
        b'{"model":"m\xff"}',
        b'{"model":"a/b/c/d/e"}',
        b"null",
    ],
)
def test_bodies_go_refuses_or_names_it_cannot_find_pass_untouched(raw):
    result = classify("/api/generate", raw)
    assert result.kind is RouteKind.PASS and result.body is None


@pytest.mark.parametrize(
    "name",
    ["m", "M", "m:latest", "library/m", "library/M:Latest", "registry.ollama.ai/library/m:latest"],
)
def test_names_resolve_as_ollama_resolves_them(name):
    raw = b'{"model":"' + name.encode() + b'","prompt":"x"}'
    assert classify("/api/generate", raw).model == "m:latest"


def test_per_model_settings_apply_to_every_spelling_of_the_name():
    for name in ("bge-m3", "BGE-M3:latest", "registry.ollama.ai/library/bge-m3"):
        raw = b'{"model":"' + name.encode() + b'","input":"x"}'
        assert classify("/api/embed", raw).idle_ttl == 901.0


def test_duplicate_options_merge_as_go_decodes_a_map_twice():
    raw = b'{"model":"m","options":{"num_ctx":8},"Options":{"num_batch":2}}'
    assert classify("/api/embed", raw).options_key == "num_ctx=8,num_batch=2"


def test_v1_chat_reads_messages_case_insensitively():
    body = b'{"Model":"M","Messages":[{"role":"user","Content":"hi"}]}'
    result = classify("/v1/chat/completions", body)
    assert result.kind is RouteKind.DEMAND and result.model == "m:latest"
