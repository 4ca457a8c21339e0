"""The common case's fast reading of an Ollama body answers as Go's full rules do, or declines.

`Bound.locate` finds a member's place without walking the top level, and
`govalues.decode_fresh` decodes a field without Go's rules for duplicates; both answer only
for a body in the common case (each key once, by its own name, no `\\u00` escape of an
ASCII character, which a key could hide in) and decline otherwise. Checked on the oracle
fuzzer's corpus (tests/faults/oraclegen.py: field types changed, key case and Go's folds,
duplicates, lone surrogates, deep nesting, trailing bytes) and on generated bodies whose
keys repeat and fold at every level: whatever the fast reading answers is what the full
reading answers, and the adapter classifies every body the same with the fast reading as
without it.
"""

from __future__ import annotations

import json
import random

import attrs
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpugate.runtimes.ollama import adapter
from gpugate.runtimes.ollama.gojson import Bound, GoJsonError, Member
from gpugate.runtimes.ollama.gojson_fast import read_struct
from gpugate.runtimes.ollama.gojson_scan import ScanError
from gpugate.runtimes.ollama.gotypes import GoKind, GoType
from gpugate.runtimes.ollama.govalues import (
    DECLINED,
    GoSlice,
    decode,
    decode_bound,
    decode_fresh,
    decode_members,
    field_name,
)
from gpugate.runtimes.ollama.reading import READERS
from gpugate.runtimes.ollama.requests import CHAT, OPENAI_CHAT
from tests.faults.oraclegen import VALID, ollama_body
from tests.runtimes.test_ollama_adapter import READING

ROUTES = sorted(READERS)
CORPUS_ROUTES = sorted(VALID)
"""The routes the oracle fuzzer writes bodies for."""


def _norm(value: object) -> list[object]:
    """A decoded value as a flat list of tokens, each slice's spare elements included, to
    compare values nested past the recursion limit (the corpus nests to 10,000)."""
    tokens: list[object] = []
    stack = [value]
    while stack:
        item = stack.pop()
        if type(item) is GoSlice:
            tokens.append(("slice", len(item), len(item.spare)))
            stack.extend(reversed([*item, *item.spare]))
        elif type(item) is list:
            tokens.append(("list", len(item)))
            stack.extend(reversed(item))
        elif type(item) is dict:
            keys = sorted(item)
            tokens.append(("dict", *keys))
            stack.extend(reversed([item[k] for k in keys]))
        elif type(item) is tuple:
            tokens.append(("pairs", *(k for k, _ in item)))
            stack.extend(reversed([v for _, v in item]))
        else:
            tokens.append((type(item).__name__, item))
    return tokens


def _members(members: tuple[Member, ...]) -> list[object]:
    return [(m.key, m.start, m.value_start, m.end, m.stop, _norm(m.value)) for m in members]


def _bound(body: bytes, path: str) -> Bound | None:
    try:
        return read_struct(body, READERS[path].kind)
    except (GoJsonError, ScanError):
        return None


def _without_fast_path(body: bytes, kind) -> Bound:
    """The reading with no field in the common case: every caller takes Go's full rules."""
    return attrs.evolve(read_struct(body, kind), single={})


def _classify(path: str, body: bytes) -> object:
    return READING.classify("POST", path, body, "application/json")


def check_agreement(path: str, body: bytes) -> int:
    """Every fast answer equals the full one; returns how many fast answers were given."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(adapter, "read_struct", _without_fast_path)
        full = _classify(path, body)
    assert _classify(path, body) == full
    bound = _bound(body, path)
    if bound is None:
        return 0
    kind = READERS[path].kind
    answered = 0
    for name in kind.fields:
        walked = attrs.evolve(bound, single={}).members(name)
        located = bound.locate(name)
        if located is not None:
            answered += 1
            assert _members(located) == _members(walked)
        assert _members(bound.members(name)) == _members(walked)
        if name in bound.single:
            assert [m.key for m in walked] == [name]
        assert _norm(decode_bound(bound, kind, name)) == _norm(
            decode_members(bound.pairs, kind, name)
        )
    for key, value in bound.pairs:
        name = field_name(kind, key)
        if name is None:
            continue
        field = kind.fields[name]
        fresh = decode_fresh(value, field)
        if fresh is not DECLINED:
            answered += 1
            assert _norm(fresh) == _norm(decode(value, field))
    return answered


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(CORPUS_ROUTES), st.integers(0, 2**32 - 1))
def test_the_fuzz_corpus_reads_the_same_fast(path, seed):
    body = ollama_body(random.Random(seed), path).encode("utf-8", "surrogatepass")
    check_agreement(path, body)


# -- generated bodies: every key of every struct, in its own case and folded, repeated --------

NAMES = sorted(
    {
        "model", "messages", "keep_alive", "format", "options", "prompt", "stream", "think",
        "tools", "role", "content", "tool_calls", "function", "arguments", "name", "images",
        "type", "reasoning", "effort", "reasoning_effort", "input", "text", "image_url", "url",
        "max_tokens", "top_logprobs", "num_ctx", "suffix", "template", "raw", "parameters",
        "properties", "system", "thinking", "tool_call_id", "index", "id", "x",
    }
)  # fmt: skip


def _spellings(name: str) -> list[str]:
    return [name, name.upper(), name.capitalize(), name.replace("k", "\u212a"), name + "_"]


KEYS = st.sampled_from(NAMES).flatmap(lambda n: st.sampled_from(_spellings(n)))
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from(["5m", "-1", "0", "json", "user", "hi", "aGk=", "", '{"a": 1}', "high"]),
    st.text(max_size=4),
).map(lambda v: json.dumps(v, ensure_ascii=False))
LITERALS = st.sampled_from(["1e400", '"\\ud800"', '"\\u006bey"', '"a\\"keep_alive\\": 1"'])


def _object(inner: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    pairs = st.lists(st.tuples(KEYS, inner), max_size=5)
    return pairs.map(lambda ps: "{" + ", ".join(f"{json.dumps(k)}: {v}" for k, v in ps) + "}")


VALUES = st.recursive(
    SCALARS | LITERALS,
    lambda inner: (
        st.lists(inner, max_size=4).map(lambda xs: "[" + ", ".join(xs) + "]") | _object(inner)
    ),
    max_leaves=25,
)
BODIES = st.lists(st.tuples(KEYS, VALUES), max_size=8).map(
    lambda ps: "{" + ",".join(f"{json.dumps(k)}:{v}" for k, v in ps) + "}"
)


_CUSTOM = {
    "api.Duration": ['"5m"', "300", '"-1"', "-1", '"x"'],
    "api.ThinkValue": ["true", "false", '"high"', '"x"'],
    "api.PropertyType": ['"string"', '["string", "null"]'],
}


@st.composite
def typed(draw, kind: GoType, depth: int = 0) -> str:
    """JSON text of the Go type's shape, mostly well typed, its objects' keys spelled as
    the fields are (mostly), folded, unknown, repeated or null."""
    if depth > 4 or draw(st.integers(0, 19)) == 0:
        return draw(VALUES)  # anything at all: often a mismatch Go refuses
    k = kind.kind
    if k is GoKind.STRING:
        return draw(SCALARS.filter(lambda v: v.startswith('"')))
    if k is GoKind.BOOL:
        return draw(st.sampled_from(["true", "false"]))
    if k in (GoKind.INT, GoKind.INT32, GoKind.UINT8):
        return str(draw(st.integers(0, 300)))
    if k in (GoKind.FLOAT64, GoKind.FLOAT32):
        return json.dumps(draw(st.floats(-1e6, 1e6)))
    if k is GoKind.BYTES:
        return draw(st.sampled_from(['"aGk="', "[104, 105]"]))
    if k is GoKind.SLICE:
        items = draw(st.lists(typed(kind.elem, depth + 1), max_size=3))
        return "[" + ", ".join(items) + "]"
    if k is GoKind.MAP:
        pairs = draw(st.lists(st.tuples(KEYS, typed(kind.elem, depth + 1)), max_size=3))
        return "{" + ", ".join(f"{json.dumps(key)}: {v}" for key, v in pairs) + "}"
    if k is GoKind.CUSTOM:
        if kind.parts:
            return draw(typed(kind.parts[0], depth + 1))
        return draw(st.sampled_from(_CUSTOM.get(kind.name, ["null"])))
    if k is GoKind.STRUCT:
        names = sorted(kind.fields)
        members = []
        for _ in range(draw(st.integers(0, min(6, len(names) + 1)))):
            name = draw(st.sampled_from(names))
            roll = draw(st.integers(0, 9))
            key = name if roll < 7 else draw(st.sampled_from([*_spellings(name), "x"]))
            value = "null" if roll == 9 else draw(typed(kind.fields[name], depth + 1))
            written = json.dumps(key)
            if roll == 8 and draw(st.booleans()):
                written = f'"\\u{ord(name[0]):04x}{name[1:]}"'  # the name, its first letter escaped
            members.append(f"{written}: {value}")
        return "{" + ", ".join(members) + "}"
    return draw(VALUES)  # interface{}, raw JSON


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(ROUTES), BODIES)
def test_generated_bodies_read_the_same_fast(path, text):
    check_agreement(path, text.encode("utf-8", "surrogatepass"))


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(ROUTES).flatmap(lambda p: st.tuples(st.just(p), typed(READERS[p].kind))))
def test_typed_bodies_read_the_same_fast(route_and_text):
    path, text = route_and_text
    check_agreement(path, text.encode("utf-8", "surrogatepass"))


@st.composite
def hidden_names(draw) -> tuple[str, str]:
    """A body whose one member of a field spells its key with an escaped ASCII letter,
    and where the key as written plainly is found once, in an unknown field's object."""
    path = draw(st.sampled_from(ROUTES))
    kind = READERS[path].kind
    name = draw(st.sampled_from(sorted(kind.fields)))
    at = draw(st.integers(0, len(name) - 1))
    escaped = name[:at] + f"\\u{ord(name[at]):04x}" + name[at + 1 :]
    members = [
        f'"{escaped}": {draw(typed(kind.fields[name], 1))}',
        f'"x": {{"{name}": {draw(SCALARS)}}}',
        *(
            f'"{n}": {draw(typed(kind.fields[n], 1))}'
            for n in draw(st.sets(st.sampled_from(sorted(set(kind.fields) - {name})), max_size=3))
        ),
    ]
    return path, "{" + ", ".join(draw(st.permutations(members))) + "}"


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(hidden_names())
def test_a_name_hidden_behind_an_escape_is_never_located(route_and_text):
    path, text = route_and_text
    check_agreement(path, text.encode())


# -- the common case is taken, the odd one declined -------------------------------------------

CHAT_BODY = json.dumps(
    {
        "model": "llama3.2:3b",
        "messages": [
            {"role": "system", "content": "Answer briefly."},
            {"role": "user", "content": "What is the capital of France?"},
        ],
        "options": {"temperature": 0.7, "num_ctx": 8192},
        "keep_alive": "10m",
    }
).encode()
OPENAI_BODY = json.dumps(
    {
        "model": "llama3.2:3b",
        "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}],
        "temperature": 0.7,
    }
).encode()


def test_a_common_body_takes_the_fast_path():
    bound = read_struct(CHAT_BODY, CHAT)
    assert bound.locate("keep_alive") is not None
    escaped = CHAT_BODY.replace(b"France", b"\\u00cele-de-France")  # not ASCII: still fast
    assert read_struct(escaped, CHAT).locate("keep_alive") is not None
    assert check_agreement("/api/chat", escaped) > 0
    assert check_agreement("/api/chat", CHAT_BODY) > 0
    messages = read_struct(OPENAI_BODY, OPENAI_CHAT).single["messages"]
    assert decode_fresh(messages, OPENAI_CHAT.fields["messages"]) == [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "yo"},
    ]


@pytest.mark.parametrize(
    "body",
    [
        b'{"model": "m", "keep_alive": "5m", "KEEP_ALIVE": "1m"}',  # folded duplicate
        b'{"model": "m", "keep_alive": "5m", "keep_alive": "1m"}',  # duplicate
        b'{"model": "m", "keep_alive": "5m", "prompt": "\\u0041"}',  # an ASCII escape
        b'{"keep\\u005falive": "5m", "options": {"keep_alive": 1}}',  # the key escaped
        b'{"model": "m", "options": {"keep_alive": 1}, "keep_alive": "5m"}',  # found twice
        b'{"model": "m", "x\\"keep_alive": 1, "keep_alive": "5m"}',  # inside another key
        b'{"model": "m", "prompt": "keep_alive", "keep_alive": "5m"}',  # a string value too
    ],
)
def test_an_odd_body_is_located_by_walking(body):
    bound = read_struct(body, CHAT)
    assert bound.locate("keep_alive") is None
    assert check_agreement("/api/chat", body) >= 0


@pytest.mark.parametrize(
    "messages",
    [
        '[{"role": "user", "role": "assistant", "content": "hi"}]',
        '[{"role": "user", "Content": "hi"}]',
        '[{"role": "user", "content": "hi", "tool_calls": [{"function": {"name": "f", '
        '"name": "g", "arguments": "{}"}}]}]',
    ],
)
def test_a_struct_with_a_duplicate_or_folded_key_is_declined(messages):
    value = json.loads(messages, object_pairs_hook=tuple)
    assert decode_fresh(value, OPENAI_CHAT.fields["messages"]) is DECLINED
    body = ('{"model": "m", "messages": ' + messages + "}").encode()
    check_agreement("/v1/chat/completions", body)
