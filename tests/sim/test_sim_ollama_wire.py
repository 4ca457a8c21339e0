"""Go-compatible pieces of the simulated Ollama: durations, JSON binding, names, times."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpugate_sim.ollama.binding import BindError, EmptyBody, GoType, Struct, bind
from gpugate_sim.ollama.catalog import ModelName
from gpugate_sim.ollama.duration import (
    FOREVER,
    HOUR,
    MAX_INT64,
    MICROSECOND,
    MILLISECOND,
    MIN_INT64,
    MINUTE,
    SECOND,
    DurationError,
    decode_keep_alive,
    format_go_duration,
    parse_go_duration,
    parse_keep_alive_setting,
)
from gpugate_sim.ollama.wire import go_json, rfc3339

# Cases from Go's time package tests (time_test.go, TestParseDuration / TestDurationString).
PARSES = [
    ("0", 0),
    ("5s", 5 * SECOND),
    ("-5s", -5 * SECOND),
    ("+5s", 5 * SECOND),
    ("-0", 0),
    ("5.6s", 5 * SECOND + 600 * MILLISECOND),
    ("5.s", 5 * SECOND),
    (".5s", 500 * MILLISECOND),
    ("100.00100s", 100 * SECOND + 1 * MILLISECOND),
    ("10ns", 10),
    ("11us", 11 * MICROSECOND),
    ("12\u00b5s", 12 * MICROSECOND),
    ("12\u03bcs", 12 * MICROSECOND),
    ("13ms", 13 * MILLISECOND),
    ("15m", 15 * MINUTE),
    ("16h", 16 * HOUR),
    ("3h30m", 3 * HOUR + 30 * MINUTE),
    ("10.5s4m", 4 * MINUTE + 10 * SECOND + 500 * MILLISECOND),
    ("-2m3.4s", -(2 * MINUTE + 3 * SECOND + 400 * MILLISECOND)),
    ("1h2m3s4ms5us6ns", HOUR + 2 * MINUTE + 3 * SECOND + 4 * MILLISECOND + 5 * MICROSECOND + 6),
    ("39h9m14.425s", 39 * HOUR + 9 * MINUTE + 14 * SECOND + 425 * MILLISECOND),
    ("0.3333333333333333333h", 20 * MINUTE),
    ("9007199254740993ns", (1 << 53) + 1),
    ("9223372036854775807ns", MAX_INT64),
    ("9223372036854775.807us", MAX_INT64),
    ("-9223372036854775808ns", MIN_INT64),
    ("0.100000000000000000000h", 6 * MINUTE),
    ("0.830103483285477580700h", 49 * MINUTE + 48 * SECOND + 372539827),
]
PARSE_ERRORS = [
    ("", 'time: invalid duration ""'),
    ("3", 'time: missing unit in duration "3"'),
    ("-", 'time: invalid duration "-"'),
    ("s", 'time: invalid duration "s"'),
    (".", 'time: invalid duration "."'),
    ("-.", 'time: invalid duration "-."'),
    (".s", 'time: invalid duration ".s"'),
    ("1d", 'time: unknown unit "d" in duration "1d"'),
    ("9223372036854775808ns", 'time: invalid duration "9223372036854775808ns"'),
    ("3000000h", 'time: invalid duration "3000000h"'),
    ("-9223372036854775809ns", 'time: invalid duration "-9223372036854775809ns"'),
    ("1\u00e9s", 'time: unknown unit "\\xc3\\xa9s" in duration "1\\xc3\\xa9s"'),
]
FORMATS = [
    ("0s", 0),
    ("1ns", 1),
    ("1.1\u00b5s", 1100),
    ("2.2ms", 2200 * MICROSECOND),
    ("3.3s", 3300 * MILLISECOND),
    ("4m5s", 4 * MINUTE + 5 * SECOND),
    ("4m5.001s", 4 * MINUTE + 5001 * MILLISECOND),
    ("5h6m7.001s", 5 * HOUR + 6 * MINUTE + 7001 * MILLISECOND),
    ("8m0.000000001s", 8 * MINUTE + 1),
    ("1h0m0s", HOUR),
    ("2562047h47m16.854775807s", MAX_INT64),
    ("-2562047h47m16.854775808s", MIN_INT64),
]


@pytest.mark.parametrize(("text", "ns"), PARSES)
def test_parse_go_duration(text: str, ns: int) -> None:
    assert parse_go_duration(text) == ns


@pytest.mark.parametrize(("text", "message"), PARSE_ERRORS)
def test_parse_go_duration_errors_are_gos(text: str, message: str) -> None:
    with pytest.raises(DurationError) as caught:
        parse_go_duration(text)
    assert str(caught.value) == message


@pytest.mark.parametrize(("text", "ns"), FORMATS)
def test_format_go_duration(text: str, ns: int) -> None:
    assert format_go_duration(ns) == text


@given(st.integers(min_value=MIN_INT64, max_value=MAX_INT64))
def test_format_then_parse_is_the_identity(ns: int) -> None:
    assert parse_go_duration(format_go_duration(ns)) == ns


@pytest.mark.parametrize(
    ("value", "ns"),
    [
        (0, 0),
        (0.0, 0),
        ("0", 0),
        ("0s", 0),
        (300, 300 * SECOND),
        (0.5, 500 * MILLISECOND),
        ("5m", 5 * MINUTE),
        ("1h30m", 90 * MINUTE),
        ("300ms", 300 * MILLISECOND),
        (-1, FOREVER),
        (-0.5, FOREVER),
        ("-1m", FOREVER),
        (1e300, MIN_INT64),  # Go's float-to-int64 overflow on amd64
    ],
)
def test_keep_alive_json_values(value: object, ns: int) -> None:
    assert decode_keep_alive(value) == ns


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("300", 'time: missing unit in duration "300"'),
        (True, "Unsupported type: 'bool'"),
        ({"s": 1}, "Unsupported type: 'map[string]interface {}'"),
        ([], "Unsupported type: '[]interface {}'"),
    ],
)
def test_keep_alive_json_errors(value: object, message: str) -> None:
    with pytest.raises(DurationError) as caught:
        decode_keep_alive(value)
    assert str(caught.value) == message


@pytest.mark.parametrize(
    ("value", "ns"),
    [
        ("5m", 5 * MINUTE),
        ("300", 300 * SECOND),
        ("-1", FOREVER),
        (-1, FOREVER),
        (30, 30 * SECOND),
        ("0.5", 500 * MILLISECOND),
        (0.25, 250 * MILLISECOND),
    ],
)
def test_keep_alive_setting_accepts_what_ollama_keep_alive_does(value: object, ns: int) -> None:
    assert parse_keep_alive_setting(value) == ns


@pytest.mark.parametrize("value", ["soon", "", None, True, "5 m", float("nan"), "nan"])
def test_keep_alive_setting_refuses_what_ollama_would_silently_replace(value: object) -> None:
    with pytest.raises(DurationError):
        parse_keep_alive_setting(value)


GENERATE = Struct("api.GenerateRequest", {"model": GoType.STRING, "stream": GoType.BOOL})


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"{", "unexpected EOF"),
        (b'{"model" "x"}', "invalid character '\"' after object key"),
        (b'{"model": "x" "stream": true}', "invalid character '\"' after object key:value pair"),
        (b"[1 2]", "invalid character '2' after array element"),
        (b"{model: 1}", "invalid character 'm' looking for beginning of object key string"),
        (b"nope", "invalid character 'o' in literal null (expecting 'u')"),
        (b"tru", "unexpected EOF"),
        (b"x", "invalid character 'x' looking for beginning of value"),
        (b'{"model": NaN}', "invalid character 'N' looking for beginning of value"),
        (b"[]", "json: cannot unmarshal array into Go value of type api.GenerateRequest"),
        (
            b'{"stream": "yes"}',
            "json: cannot unmarshal string into Go struct field "
            "GenerateRequest.stream of type bool",
        ),
    ],
)
def test_bind_errors_are_gos(body: bytes, message: str) -> None:
    with pytest.raises(BindError) as caught:
        bind(body, GENERATE)
    assert str(caught.value) == message


def test_bind_reads_only_the_first_value_and_flags_an_empty_body() -> None:
    assert bind(b' {"model": "m"} trailing garbage', GENERATE) == {"model": "m"}
    with pytest.raises(EmptyBody):
        bind(b" \n\t", GENERATE)


@pytest.mark.parametrize(
    ("text", "short", "key"),
    [
        ("llama3.2", "llama3.2:latest", "registry.ollama.ai/library/llama3.2:latest"),
        ("Llama3.2:LATEST", "Llama3.2:LATEST", "registry.ollama.ai/library/llama3.2:latest"),
        ("library/llama3.2:3b", "llama3.2:3b", "registry.ollama.ai/library/llama3.2:3b"),
        ("user/model", "user/model:latest", "registry.ollama.ai/user/model:latest"),
        ("hf.co/org/repo:Q4_K_M", "hf.co/org/repo:Q4_K_M", "hf.co/org/repo:q4_k_m"),
        ("localhost:5000/ns/m", "localhost:5000/ns/m:latest", "localhost:5000/ns/m:latest"),
    ],
)
def test_model_names_normalise_like_ollamas(text: str, short: str, key: str) -> None:
    name = ModelName.parse(text)
    assert name is not None and (name.short, name.key) == (short, key)


@pytest.mark.parametrize("text", ["", "  ", "a/b/c/d", "model:", "/model"])
def test_invalid_model_names(text: str) -> None:
    assert ModelName.parse(text) is None


def test_rfc3339_is_gos_time_format() -> None:
    assert rfc3339(1_700_000_000_123_456_789) == "2023-11-14T22:13:20.123456789Z"
    assert rfc3339(1_700_000_000_000_000_000) == "2023-11-14T22:13:20Z"
    local = datetime(2024, 5, 1, 12, 0, 0, 250000, tzinfo=timezone(timedelta(hours=2)))
    assert rfc3339(local) == "2024-05-01T12:00:00.25+02:00"
    assert rfc3339(datetime(2024, 5, 1, tzinfo=UTC)) == "2024-05-01T00:00:00Z"


def test_go_json_is_compact_and_html_safe() -> None:
    assert go_json({"a": "<b>&", "n": [1, 2], "u": "é"}) == (
        '{"a":"\\u003cb\\u003e\\u0026","n":[1,2],"u":"é"}'
    )


def test_sim_tokens_sets_the_answer_length_and_num_predict_still_cuts_it():
    from gpugate_sim.ollama.engine import DoneReason, plan

    natural = plan("same prompt", -1)
    longer = plan("same prompt", -1, 500)
    assert len(longer.tokens) == 500
    assert longer.tokens[: len(natural.tokens) - 1] == natural.tokens[:-1]
    cut = plan("same prompt", 40, 500)
    assert len(cut.tokens) == 40 and cut.done_reason is DoneReason.LENGTH
