"""For any object body, the rewrite touches only keep_alive members and leaves one, capped."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from gpugate.runtimes.base import RouteKind
from gpugate.runtimes.gojson import Kind, Struct, bind, fold_key, read_object
from gpugate.runtimes.keepalive import parse_keep_alive
from tests.runtimes.test_ollama_adapter import ADAPTER

KEEP_ALIVE = ["keep_alive", "KEEP_ALIVE", "Keep_Alive", "\u212aeep_alive", "kEeP_aLiVe"]
OTHER_KEYS = ["prompt", "Prompt", "options", "x", "é", "\ud800", "model_", "keepalive"]


def _string():
    lone = st.sampled_from(["\\ud800", "\\udfff", "\\u00e9", "\\n", '\\"'])
    plain = st.text(st.characters(blacklist_categories=("Cs", "Cc")), max_size=5)
    return st.lists(
        st.one_of(plain.map(lambda s: json.dumps(s, ensure_ascii=False)[1:-1]), lone), max_size=4
    ).map(lambda parts: '"' + "".join(parts) + '"')


_NUMBER = st.sampled_from(
    ["0", "-1", "1.5", "1e400", "3600", "1E+2", "-0.0", "12345678901234567890"]
)
_DURATION = st.sampled_from(['"24h"', '"1s"', '"0"', '"5m"', "300", "-1", "null", "0.5"])
_VALUE = st.one_of(_string(), _NUMBER, st.sampled_from(["true", "null", "[]", '{"a":1e400}']))


@st.composite
def bodies(draw):
    members = [(json.dumps("model"), json.dumps(draw(st.sampled_from(["m", "M", "library/m"]))))]
    for _ in range(draw(st.integers(0, 6))):
        if draw(st.booleans()):
            key = json.dumps(draw(st.sampled_from(KEEP_ALIVE)), ensure_ascii=draw(st.booleans()))
            members.append((key, draw(_DURATION)))
        else:
            key = json.dumps(draw(st.sampled_from(OTHER_KEYS)))
            members.append((key, draw(_VALUE)))
    members = draw(st.permutations(members))
    space = draw(st.sampled_from(["", " ", "\n  "]))
    inner = ("," + space).join(f"{k}{space}:{space}{v}" for k, v in members)
    return ("{" + space + inner + space + "}").encode("utf-8", "surrogatepass")


def _strip_keep_alive(raw: bytes) -> list[tuple[str, str]]:
    doc = read_object(raw)
    return [
        (doc.text[m.start : m.value_start], doc.text[m.value_start : m.end])
        for m in doc.members
        if fold_key(m.key) != "KEEP_ALIVE"
    ]


@settings(max_examples=300, deadline=None)
@given(bodies())
def test_rewrite_changes_only_keep_alive_and_leaves_one_capped(raw):
    result = ADAPTER.classify("POST", "/api/embed", raw, "application/json")
    if result.kind is not RouteKind.DEMAND:
        return
    sent = raw if result.body is None else result.body
    # Everything but the keep_alive members is byte for byte what the client sent.
    assert _strip_keep_alive(sent) == _strip_keep_alive(raw)
    doc = read_object(sent)
    # Read the Go way, exactly one keep_alive is left, and it is the capped value.
    (only,) = bind(doc, Struct({"keep_alive": Kind.DURATION})).members("keep_alive")
    seconds = parse_keep_alive(only.value).seconds
    assert seconds == result.idle_ttl and seconds <= 900.0
