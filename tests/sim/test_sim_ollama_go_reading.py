"""The simulated Ollama reads bodies as Go 1.26's encoding/json does: null, key folding,
duplicates; and it refuses, once the model is loaded, what Ollama refuses then."""

from __future__ import annotations

import json
from pathlib import Path

import aiohttp
import pytest

from gpugate.sim.ollama.binding import BindError, bind
from gpugate.sim.ollama.gotemplate import TemplateError, parse
from gpugate.sim.ollama.requests import CHAT, CHAT_COMPLETION, GENERATE
from gpugate.sim.ollama.server import SimOllama
from tests.sim.test_sim_ollama import MakeSim, make_sim, sim  # noqa: F401  (fixtures)

MODEL = "llama3.2"


async def post(server: SimOllama, path: str, body: bytes) -> tuple[int, dict[str, str], bytes]:
    async with (
        aiohttp.ClientSession() as session,
        session.post(server.url + path, data=body) as resp,
    ):
        return resp.status, dict(resp.headers), await resp.read()


# -- null ---------------------------------------------------------------------------------


def test_null_leaves_a_string_and_nils_a_pointer_map_or_slice() -> None:
    body = (
        b'{"model":"llama3.2","model":null,"keep_alive":"1h","keep_alive":null,'
        b'"options":{"num_ctx":8},"options":null,"messages":[{"role":"user"}],"messages":null}'
    )
    assert bind(body, CHAT) == {
        "model": "llama3.2",
        "keep_alive": None,
        "options": None,
        "messages": None,
    }


def test_a_second_options_object_after_null_starts_a_new_map() -> None:
    body = b'{"options":{"num_ctx":8},"options":null,"options":{"seed":1}}'
    assert bind(body, GENERATE)["options"] == {"seed": 1}


async def test_a_null_model_after_the_name_still_loads_the_model(sim: SimOllama) -> None:  # noqa: F811
    status, _, _ = await post(
        sim, "/api/generate", b'{"model":"llama3.2","model":null,"prompt":"hi"}'
    )
    assert status == 200
    assert sim.state().runner("llama3.2:latest") is not None


# -- keys -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("key", "field"),
    [
        ("MODEL", "model"),
        ("\u212aeep_alive", "keep_alive"),  # KELVIN SIGN folds to K
        ("\u017fy\u017ftem", "system"),  # LONG S folds to S
        ("\u017fuffix", "suffix"),
        ("me\u00dfages", None),  # ß is not "ss" to Go
        ("opt\u0131ons", None),  # dotless ı is not "i"
        ("\ufb06ream", None),  # the ﬆ ligature is not "st"
        ("\ufb05ream", None),  # nor is ﬅ
        ("m\uff4fdel", None),  # a fullwidth o is not o
    ],
)
def test_keys_find_fields_only_as_gos_fold_finds_them(key: str, field: str | None) -> None:
    # A key that finds a field is decoded into it: an array is an error for each of these
    # fields. A key that finds none is skipped unread.
    body = json.dumps({"model": "m", key: [1]}).encode()
    struct = CHAT if "age" in key else GENERATE
    if field is None:
        assert bind(body, struct)["model"] == "m"
        return
    with pytest.raises(BindError):
        bind(body, struct)


def test_a_duplicate_spelled_otherwise_is_the_same_field_and_the_last_wins() -> None:
    bound = bind(
        b'{"model":"a","MODEL":"b","Model":"c","keep_alive":"1s","KEEP_ALIVE":2}', GENERATE
    )
    assert (bound["model"], bound["keep_alive"]) == ("c", 2_000_000_000)


def test_an_invalid_keep_alive_ends_decoding_even_if_a_later_one_is_valid() -> None:
    with pytest.raises(BindError, match='time: invalid duration "x"'):
        bind(b'{"model":"m","keep_alive":"x","keep_alive":"5m"}', GENERATE)


@pytest.mark.parametrize(
    ("value", "error"),
    [
        ('"x"', 'invalid think value: "x"'),
        ("1", "think must be a boolean or string"),
        ("[]", "think must be a boolean or string"),
    ],
)
def test_think_is_decoded_by_its_own_unmarshaler(value: str, error: str) -> None:
    with pytest.raises(BindError, match=error):
        bind(b'{"model":"m","think":' + value.encode() + b"}", GENERATE)
    assert bind(b'{"model":"m","think":"low","think":null}', GENERATE)["think"] is None


def test_a_second_messages_array_decodes_into_the_first_ones_elements() -> None:
    # openai.Message has no UnmarshalJSON: the second array's element 0 is decoded into
    # the first one's, which keeps its tool_calls (decode.go array()).
    body = (
        b'{"messages":[{"role":"user","tool_calls":[{"function":{"arguments":"x"}}]}],'
        b'"MESSAGES":[{"content":"hi"}]}'
    )
    (message,) = bind(body, CHAT_COMPLETION)["messages"]
    assert message == {
        "role": "user",
        "content": "hi",
        "tool_calls": [{"function": {"arguments": "x"}}],
    }


def test_a_slice_reuses_what_its_backing_array_held_past_its_length() -> None:
    body = b'{"context":[1,2,3],"context":[4],"context":[5,null,null]}'
    assert bind(body, GENERATE)["context"] == [5, 2, 3]


def test_a_second_reasoning_object_keeps_the_first_ones_effort() -> None:
    body = b'{"reasoning":{"effort":"low"},"reasoning":{}}'
    assert bind(body, CHAT_COMPLETION)["reasoning"] == {"effort": "low"}


# -- refused once loaded ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("template", "error"),
    [
        ("{{", "template: :1: unclosed action"),
        ("x\n{{ .Prompt\n", "template: :3: unclosed action started at :2"),
        ("{{ end }}", "template: :1: unexpected {{end}}"),
        ("{{ if .System }}", "template: :1: unexpected EOF"),
        ("{{ foo }}", 'template: :1: function "foo" not defined'),
        ("{{ $x }}", 'template: :1: undefined variable "$x"'),
        ('{{ template "x" }}', "undefined template specified"),
        ("{{ 08 }}", 'template: :1: integer overflow: "08"'),
        ("{{ 1+2i }}", ""),
        ("{{ .Prompt }}", ""),
    ],
)
def test_templates_fail_with_text_templates_words(template: str, error: str) -> None:
    if not error:
        parse(template)
        return
    with pytest.raises(TemplateError) as refused:
        parse(template)
    assert str(refused.value) == error


@pytest.mark.parametrize(
    ("extra", "content_type"),
    [({}, "application/json"), ({"stream": False}, "application/json; charset=utf-8")],
)
async def test_a_format_ollama_refuses_is_a_500_with_the_model_loaded(
    sim: SimOllama,  # noqa: F811
    extra: dict,
    content_type: str,
) -> None:
    body = json.dumps({"model": MODEL, "prompt": "hi", "format": "yaml", **extra}).encode()
    status, headers, answer = await post(sim, "/api/generate", body)
    assert status == 500
    assert headers["Content-Type"] == content_type
    expected = 'invalid format: "\\"yaml\\""; expected "json" or a valid JSON Schema object'
    assert json.loads(answer) == {"error": expected}
    assert sim.state().runner("llama3.2:latest") is not None


async def test_a_template_that_does_not_parse_is_a_500_with_the_model_loaded(
    sim: SimOllama,  # noqa: F811
) -> None:
    body = b'{"model":"llama3.2","prompt":"hi","template":"{{","format":"yaml"}'
    status, headers, answer = await post(sim, "/api/generate", body)
    assert status == 500
    assert headers["Content-Type"] == "application/json; charset=utf-8"
    # The template is parsed before the format is looked at.
    assert json.loads(answer) == {"error": "template: :1: unclosed action"}
    assert sim.state().runner("llama3.2:latest") is not None
    # raw: the template is not parsed.
    body = b'{"model":"llama3.2","prompt":"hi","raw":true,"template":"{{","stream":false}'
    status, _, _ = await post(sim, "/api/generate", body)
    assert status == 400  # raw mode does not support template, system, or context


# -- the record of readings -------------------------------------------------------------


async def test_each_reading_is_recorded_for_the_oracle(make_sim: MakeSim, tmp_path: Path) -> None:  # noqa: F811
    record = tmp_path / "readings.jsonl"
    server = await make_sim(record=record)
    await post(server, "/api/chat?case=1", b'{"model":"llama3.2","messages":5}')
    await post(
        server,
        "/api/generate?case=2",
        b'{"model":"llama3.2","prompt":"hi","keep_alive":"1m","options":{"num_ctx":2048.9},'
        b'"format":"yaml"}',
    )
    lines = [json.loads(line) for line in record.read_text().splitlines()]
    assert [(r["case"], r["loads"], r["malformed"], r["status"]) for r in lines] == [
        ("1", False, True, 400),
        ("2", True, False, 500),
    ]
    assert lines[1]["model"] == "llama3.2:latest"
    assert lines[1]["keep_alive"] == 60_000_000_000
    assert lines[1]["runner"] == {"num_ctx": 2048}
    assert lines[1]["after_load"].startswith("invalid format: ")
