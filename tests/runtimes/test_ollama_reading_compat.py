"""/v1/responses and /v1/messages read against their own Go types, and duplicates of
slice and struct fields read as Go merges them (Ollama v0.24.0, Go 1.26 encoding/json)."""

from __future__ import annotations

import pytest

from gpugate.runtimes.base import RouteKind
from gpugate.runtimes.ollama.govalues import GoSlice, decode_members
from gpugate.runtimes.ollama.requests import CHAT, OPENAI_CHAT
from tests.runtimes.test_ollama_adapter import READING

_PNG = "data:image/png;base64,iVBORw0KGgo="
_BLOCK_IMAGE = b'{"type":"image","source":{"type":"base64","data":"YQ=="}}'


def kind(path: str, body: bytes):
    return READING.classify("POST", path, body, "application/json")


def responses(rest: bytes) -> bytes:
    return b'{"model":"m",' + rest + b"}"


def messages(rest: bytes) -> bytes:
    return b'{"model":"m","max_tokens":8,' + rest + b"}"


@pytest.mark.parametrize(
    "body",
    [
        responses(b'"input":"hi"'),
        responses(b'"input":[{"role":"user","content":"hi"}]'),
        responses(b'"input":[{"type":"message","role":"user","content":null}]'),
        responses(
            b'"input":[{"role":"user","content":[{"type":"input_text","text":"a"},'
            b'{"type":"input_image","detail":"auto","image_url":"' + _PNG.encode() + b'"},'
            b'{"type":"input_image","detail":"auto","file_id":"f"}]}]'
        ),
        responses(b'"input":[{"type":"function_call","call_id":"c","name":"f","arguments":""}]'),
        responses(b'"input":[{"type":"function_call","name":"f","arguments":"{\\"a\\":1}"}]'),
        responses(b'"input":[{"type":"function_call_output","call_id":"c","output":"ok"}]'),
        responses(b'"input":[{"type":"reasoning","summary":[{"type":"summary_text"}]}]'),
        responses(b'"input":"x","reasoning":{"effort":"max"}'),
        responses(b'"input":"x","reasoning":{"effort":"bad"},"reasoning":{"effort":"low"}'),
        responses(
            b'"input":"x","tools":[{"type":"function","name":"f","parameters":{"type":"object"}}]'
        ),
        responses(b'"input":"x","tools":[{"name":"f","parameters":{"type":1,"type":"object"}}]'),
        responses(b'"input":"x","text":{"format":{"type":"json_schema","schema":{"a":1}}}'),
        responses(b'"input":[{"role":"user","content":"hi"}],"input":"x"'),
        messages(b'"messages":[{"role":"user","content":"hi"}]'),
        messages(b'"messages":[{"role":"user","content":null}]'),
        messages(b'"messages":[{"role":"user","content":[' + _BLOCK_IMAGE + b"]}]"),
        messages(
            b'"messages":[{"role":"assistant","content":[{"type":"tool_use","id":"a","name":"f"}]}]'
        ),
        messages(
            b'"messages":[{"role":"user","content":[{"type":"tool_result","content":'
            b'[{"type":"image","source":{"type":"base64","data":"YQ=="}}]}]}]'
        ),
        messages(
            b'"messages":[{"role":"user","content":"x"}],"tools":[{"name":"f","input_schema":{"type":"object"}}]'
        ),
        messages(
            b'"messages":[{"role":"user","content":"x"}],"tools":[{"type":"web_search_20250305"},'
            b'{"name":"web_search","input_schema":"not a schema"}]'
        ),
    ],
)
def test_these_load(body):
    path = "/v1/responses" if b"max_tokens" not in body else "/v1/messages"
    result = kind(path, body)
    assert result.kind is RouteKind.DEMAND, body
    assert result.model == "m:latest"


@pytest.mark.parametrize(
    "body",
    [
        responses(b'"input":1'),
        responses(b'"input":{"role":"user"}'),
        responses(b'"input":[{"content":"no type"}]'),
        responses(b'"input":[{"type":"bogus"}]'),
        responses(b'"input":[null]'),
        responses(b'"input":[{"type":1}]'),
        responses(b'"input":[{"role":"user","content":1}]'),
        responses(b'"input":[{"role":"user","content":[{"type":"input_audio"}]}]'),
        responses(b'"input":[{"role":"user","content":[{"type":"input_file"}]}]'),
        # A string input leaves the items an earlier array made (ResponsesInput.Items).
        responses(b'"input":[{"role":"user","content":[{"type":"input_file"}]}],"input":"x"'),
        responses(b'"input":[{"role":"user","content":[{"type":"input_text","text":1}]}]'),
        responses(
            b'"input":[{"role":"user","content":[{"type":"input_image","image_url":"http://x/a.png"}]}]'
        ),
        responses(b'"input":[{"type":"function_call","arguments":"{nope"}]'),
        responses(b'"input":[{"type":"function_call","arguments":"[]"}]'),
        responses(b'"input":[{"type":"function_call_output","output":{"a":1}}]'),
        responses(b'"input":[{"type":"function_call_output","output":[{"type":"input_file"}]}]'),
        responses(b'"input":[{"type":"reasoning","summary":"s"}]'),
        responses(b'"input":"x","reasoning":{"effort":"extreme"}'),
        responses(
            b'"input":"x","reasoning":{"effort":"low"},"reasoning":{"summary":"auto","effort":"no"}'
        ),
        responses(b'"input":"x","tools":[{"name":"f","parameters":{"type":1}}]'),
        responses(
            b'"input":"x","tools":[{"name":"f","parameters":{"properties":{"a":{"type":2}}}}]'
        ),
        responses(b'"input":"x","temperature":"hot"'),
        responses(b'"input":"x","stream":"yes"'),
        messages(b'"messages":[]'),
        b'{"model":"m","messages":[{"role":"user","content":"x"}]}',
        b'{"model":"m","max_tokens":0,"messages":[{"role":"user","content":"x"}]}',
        b'{"model":"","max_tokens":1,"messages":[{"role":"user","content":"x"}]}',
        messages(b'"messages":[{"role":"user"}]'),
        messages(b'"messages":[{"role":"user","content":1}]'),
        messages(b'"messages":[{"role":"user","content":[{"type":"text","text":1}]}]'),
        messages(b'"messages":[{"role":"user","content":[{"type":"image"}]}]'),
        messages(
            b'"messages":[{"role":"user","content":[{"type":"image","source":{"type":"url"}}]}]'
        ),
        messages(
            b'"messages":[{"role":"user","content":[{"type":"image","source":{"type":"base64","data":"Y"}}]}]'
        ),
        messages(b'"messages":[{"role":"assistant","content":[{"type":"tool_use","name":"f"}]}]'),
        messages(
            b'"messages":[{"role":"user","content":[{"type":"tool_result","content":'
            b'[{"type":"image","source":"x"}]}]}]'
        ),
        messages(
            b'"messages":[{"role":"user","content":"x"}],"tools":[{"name":"f","input_schema":"x"}]'
        ),
        messages(b'"messages":[{"role":"user","content":"x"}],"system":1e400'),
    ],
)
def test_these_are_refused_before_loading(body):
    path = (
        "/v1/responses"
        if b"max_tokens" not in body and b'"messages"' not in body
        else ("/v1/messages")
    )
    assert kind(path, body).kind is RouteKind.PASS, body


def test_a_second_messages_array_merges_into_the_first_ones_elements():
    # Go decodes element 0 of the second array into element 0 of the first: its content
    # stays, so Ollama converts it and loads; reading the last array alone would refuse.
    body = b'{"model":"m","messages":[{"role":"user","content":"hi"}],"messages":[{"role":"user"}]}'
    assert kind("/v1/chat/completions", body).kind is RouteKind.DEMAND
    # A later member cannot take content away, but null resets the slice itself.
    body = b'{"model":"m","messages":[{"content":"hi"}],"messages":null,"messages":[{"role":"u"}]}'
    assert kind("/v1/chat/completions", body).kind is RouteKind.PASS


def test_elements_past_a_shorter_array_come_back_from_the_backing_array():
    pairs = (
        ("messages", [(("content", "a"),), (("content", "b"),)]),
        ("messages", [(("role", "x"),)]),
        ("messages", [(("role", "y"),), (("role", "z"),)]),
    )
    held = decode_members(pairs, OPENAI_CHAT, "messages")
    assert held == [{"content": "a", "role": "y"}, {"content": "b", "role": "z"}]
    body = (
        b'{"model":"m","messages":[{"content":"a"},{"content":"b"}],'
        b'"messages":[{"role":"x"}],"messages":[{"role":"y"},{"role":"z"}]}'
    )
    assert kind("/v1/chat/completions", body).kind is RouteKind.DEMAND
    # An empty array is a new slice: nothing comes back.
    pairs = (*pairs[:2], ("messages", []), pairs[2])
    assert decode_members(pairs, OPENAI_CHAT, "messages") == [{"role": "y"}, {"role": "z"}]


def test_api_message_replaces_rather_than_merges():
    # api.Message has its own UnmarshalJSON that decodes into a new value.
    pairs = (("messages", [(("content", "a"),)]), ("messages", [(("role", "x"),)]))
    held = decode_members(pairs, CHAT, "messages")
    assert isinstance(held, GoSlice) and held == [{"role": "x"}]


def test_struct_fields_merge_across_duplicates():
    body = b'{"model":"m","messages":[{"role":"user","content":"hi"}],'
    assert (
        kind("/v1/chat/completions", body + b'"reasoning":{"effort":"bad"},"reasoning":{}}').kind
        is RouteKind.PASS
    )
    assert (
        kind("/v1/chat/completions", body + b'"reasoning":{"effort":"bad"},"reasoning":null}').kind
        is RouteKind.DEMAND
    )


def test_anthropic_blocks_merge_into_the_previous_messages_blocks():
    first = b'"messages":[{"role":"assistant","content":[{"type":"tool_use","id":"a","name":"f"}]}]'
    second = b'"messages":[{"role":"assistant","content":[{"type":"tool_use"}]}]'
    assert kind("/v1/messages", messages(first + b"," + second)).kind is RouteKind.DEMAND
    assert kind("/v1/messages", messages(second)).kind is RouteKind.PASS
    # A string content replaces the blocks: nothing of the first message survives.
    text = b'"messages":[{"role":"assistant","content":"x"}]'
    assert kind("/v1/messages", messages(first + b"," + text + b"," + second)).kind is (
        RouteKind.PASS
    )


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/responses", "/v1/messages"])
@pytest.mark.parametrize("start", [b"\x28\xb5\x2f\xfd", b"\x5b\x2a\x4d\x18", b"\x50\x2a\x4d\x18"])
def test_a_zstd_body_is_never_let_through_unread(path, start):
    result = kind(path, start + b"\x00" * 12)
    assert result.kind is RouteKind.REFUSE
    assert result.refusal.status == 400
    offender = "*" if start[0] == 0x5B else chr(start[0])
    assert (
        result.refusal.message == f"invalid character '{offender}' looking for beginning of value"
    )
    assert kind("/api/chat", start + b"\x00" * 12).kind is RouteKind.PASS
