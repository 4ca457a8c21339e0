"""The one-call C reading and the non-recursive reading give the same values."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpugate.runtimes.ollama.gojson import DECODER, GoJsonError
from gpugate.runtimes.ollama.gojson_fast import read_struct
from gpugate.runtimes.ollama.gojson_scan import ScanError, scan
from gpugate.runtimes.ollama.requests import CHAT

_json = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=30,
)


@settings(max_examples=300)
@given(_json)
def test_the_iterative_reader_agrees_with_the_c_scanner(value):
    text = json.dumps(value)
    assert scan(text, 0) == DECODER.scan_once(text, 0)


@pytest.mark.parametrize("depth,ok", [(990, True), (10000, True), (10001, False)])
def test_depth_is_gos(depth, ok):
    text = "[" * depth + "]" * depth
    if ok:
        assert scan(text, 0)[1] == len(text)
    else:
        with pytest.raises(ScanError, match="exceeded max depth"):
            scan(text, 0)


def test_a_deep_body_is_read_not_refused_by_recursion():
    body = b'{"model":"m","x":' + b"[" * 5000 + b"]" * 5000 + b"}"
    assert read_struct(body, CHAT).get("model") == "m"
    with pytest.raises(GoJsonError):
        read_struct(b'{"model":"m","x":' + b"[" * 10000 + b"]" * 10000 + b"}", CHAT)


def test_every_duplicate_is_type_checked_nested_too():
    with pytest.raises(GoJsonError):
        read_struct(b'{"messages":[{"role":1,"role":"user"}]}', CHAT)
    with pytest.raises(GoJsonError):
        read_struct(b'{"model":1,"model":"m"}', CHAT)
    assert read_struct(b'{"model":"a","MODEL":"b"}', CHAT).get("model") == "b"
