"""The one-call C reading and the non-recursive reading give the same values."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpugate.runtimes.ollama.gojson import DECODER, GoJsonError, splice
from gpugate.runtimes.ollama.gojson_fast import read_struct
from gpugate.runtimes.ollama.gojson_scan import ScanError, scan
from gpugate.runtimes.ollama.requests import CHAT, GENERATE

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


def _spliced_text(text: str, keep, value: str, drop, close: int) -> bytes:
    """The same edit made in the text and the whole encoded again: the reference."""
    edits = [(m.start, m.stop, "") for m in drop]
    edits.append((keep.value_start, keep.end, value) if keep else (close, close, "," + value))
    parts, pos = [], 0
    for start, end, replacement in sorted(edits):
        parts += [text[pos:start], replacement]
        pos = end
    return ("".join(parts) + text[pos:]).encode("utf-8", "surrogateescape")


def _as_sent(text: str) -> bytes:
    """A JSON string as a client that does not escape non-ASCII sends it (lone surrogates
    become bytes that are not UTF-8)."""
    return json.dumps(text, ensure_ascii=False).encode("utf-8", "surrogatepass")


_high_bytes = st.binary(max_size=6).map(lambda raw: bytes(b | 0x80 for b in raw))
"""Bytes that are not ASCII: often invalid UTF-8, which the body keeps as it came."""


@settings(max_examples=300)
@given(
    st.text(max_size=20),
    _high_bytes,
    st.text(max_size=20),
    st.sampled_from([None, '"5m"', "0", "-1", '"1h"']),
    st.booleans(),
)
def test_a_spliced_body_keeps_its_own_bytes_around_the_edit(before, junk, after, alive, twice):
    """The keep_alive edit made in the body's own bytes equals the edited text encoded
    whole, for any text around it: non-ASCII, lone surrogates, invalid UTF-8."""
    quoted = _as_sent(before)
    members = [b'"model":"m"', b'"prompt":' + quoted[:-1] + junk + b'"']
    if alive is not None:
        members += [b'"keep_alive":' + alive.encode()] * (2 if twice else 1)
    members.append(b'"system":' + _as_sent(after))
    body = b"{" + b",".join(members) + b"} \n"
    bound = read_struct(body, GENERATE)
    found = bound.members("keep_alive")
    if found:
        *others, last = found
        edits = [(last, '"30s"', others), (None, '"keep_alive":"30s"', found)]
    else:
        edits = [(None, '"keep_alive":"30s"', ())]
    for keep, value, drop in edits:
        spliced = splice(bound, keep, value, drop)
        assert spliced == _spliced_text(bound.text, keep, value, drop, bound.close)
        assert spliced.startswith(b'{"model":"m","prompt":' + quoted[:-1] + junk)
        assert spliced.endswith(b"} \n")
