"""The fast reading (one C parse) gives exactly what the member-by-member reading gives, or
nothing; the adapter classifies and rewrites every body the same either way."""

from __future__ import annotations

import json
from unittest import mock

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from gpugate.runtimes import gojson, gojson_fast
from gpugate.runtimes.gojson import Bound, GoJsonError, Kind, Struct, bind, read_object
from gpugate.runtimes.gojson_fast import read_fast, read_struct
from tests.runtimes.test_ollama_adapter import ADAPTER

GENERATE = Struct(
    {
        "model": Kind.STRING,
        "keep_alive": Kind.DURATION,
        "options": Kind.MAP,
        "prompt": Kind.STRING,
        "stream": Kind.BOOL,
        "context": Kind.ARRAY,
        "top_logprobs": Kind.INT,
    }
)
EMBED = Struct({"model": Kind.STRING, "keep_alive": Kind.DURATION, "input": Kind.ANY})
STRUCTS = (GENERATE, EMBED)
PATHS = ("/api/generate", "/api/chat", "/api/embed", "/api/embeddings", "/v1/chat/completions")


def _slow(body: bytes, struct: Struct) -> Bound | GoJsonError:
    try:
        return bind(read_object(body), struct)
    except GoJsonError as exc:
        return exc


def _assert_same(fast: Bound, slow: Bound, struct: Struct) -> None:
    # repr tells True from 1 from 1.0, and keeps the order of every dict.
    assert repr(fast.values) == repr(slow.values)
    assert (fast.text, fast.close, fast.empty) == (slow.text, slow.close, slow.empty)
    for field in struct.fields:
        assert repr(fast.members(field)) == repr(slow.members(field))


def _check(body: bytes, struct: Struct) -> Bound | None:
    """The fast reading, after checking it and `read_struct` against the slow reading."""
    fast = read_fast(body, struct)
    slow = _slow(body, struct)
    if isinstance(slow, GoJsonError):
        assert fast is None
        with pytest.raises(type(slow)) as refused:
            read_struct(body, struct)
        assert str(refused.value) == str(slow)
        return None
    if fast is not None:
        _assert_same(fast, slow, struct)
    _assert_same(read_struct(body, struct), slow, struct)
    return fast


def _classify_both(path: str, body: bytes) -> None:
    fast = ADAPTER.classify("POST", path, body, "application/json")
    with mock.patch.object(gojson_fast, "read_fast", return_value=None):
        slow = ADAPTER.classify("POST", path, body, "application/json")
    assert fast == slow


# -- generated bodies ------------------------------------------------------------------------

FIELDS = ["model", "keep_alive", "options", "prompt", "stream", "context", "top_logprobs"]
FIELDS += ["input", "messages", "suffix", "x", "keepalive", "modelx"]
HOSTILE_KEYS = [
    '"\\ud800"',
    '""',
    '"\\"model\\""',
    '"model\\n"',
    '"keep_al\u0131ve"',
    '"\ufb06ream"',
    '"me\u00dfages"',
    '"\u00e9"',
    '"a\\\\b"',
    '"\\u212aeep_alive"',
]
_STRINGS = [
    '"x"',
    '""',
    '"model"',
    '"prompt"',
    '"keep_alive"',
    '"say \\"model\\""',
    '"\\"model"',
    '"\\"keep_alive"',
    '"\\ud800"',
    '"\\udfff x"',
    '"\\ud83d\\ude00"',
    '"\\u0041\\u00e9\\u003c"',
    '"\u00e9\u212a"',
    '"a\\nb\\t\\/"',
    '"\\\\u0041"',
    '"\x01"',
    '"m"',
    '"M"',
    '"library/m"',
    '"bge-m3"',
    '"m:cloud"',
    '" m"',
    '"a/b/c/d/e"',
    '"24h"',
    '"1s"',
    '"0"',
    '"10m"',
    '"-1m"',
    '"300"',
]
_NUMBERS = [
    "0",
    "-1",
    "1.5",
    "300",
    "1e400",
    "-1e400",
    "1E+2",
    "-0.0",
    "0.5",
    "12345678901234567890",
    "9223372036854775807",
    "9223372036854775808",
    "-9223372036854775808",
    "1" + "0" * 39,
    "1" + "0" * 40,
    "-1" + "0" * 38,
    "-1" + "0" * 39,
    "NaN",
    "Infinity",
    "-Infinity",
    "01",
    "1.",
    ".5",
]
_HOSTILE_STRINGS = {s for s in _STRINGS if "model" in s or "keep_alive" in s or "\x01" in s}
_LITERALS = ["true", "false", "null", "[]", "{}", "[{}]", "tru", "[1,]"]
_DEEP = [("[" * n + "]" * n) for n in (50, 600, 950, 2000)]


def _escape(ch: str, upper: bool) -> str:
    code = f"{ord(ch):04x}"
    return "\\u" + (code.upper() if upper else code)


@st.composite
def keys(draw, clean: bool) -> str:
    """A JSON key: a field name cased, folded (and, unless clean, escaped) in random ways,
    or (unless clean) a hostile one."""
    if not clean and draw(st.integers(0, 7)) == 0:
        return draw(st.sampled_from(HOSTILE_KEYS))
    out = []
    for ch in draw(st.sampled_from(FIELDS)):
        roll = draw(st.integers(0, 24))
        if roll < 3:
            ch = ch.swapcase()
        elif roll == 3 and ch in "kK":
            ch = "\u212a"
        elif roll == 4 and ch in "sS":
            ch = "\u017f"
        if not clean and (roll == 5 or (roll == 6 and ord(ch) > 127)):
            out.append(_escape(ch, draw(st.booleans())))
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


@st.composite
def respelled(draw, key: str) -> str:
    """The same key again: as it was, in another case, or with escapes."""
    out = []
    for ch in json.loads(key):
        roll = draw(st.integers(0, 5))
        if roll == 0:
            out.append(_escape(ch, draw(st.booleans())))
            continue
        if roll == 1 and len(ch.swapcase()) == 1:
            ch = ch.swapcase()
        out.append(json.dumps(ch)[1:-1])
    return '"' + "".join(out) + '"'


def values(clean: bool) -> st.SearchStrategy[str]:
    """A JSON value (unless clean, one that may be invalid or hold a field name's text)."""
    strings = [s for s in _STRINGS if not clean or s not in _HOSTILE_STRINGS]
    numbers = _NUMBERS[:17] if clean else _NUMBERS
    scalars = st.one_of(
        st.sampled_from(strings),
        st.sampled_from(numbers),
        st.sampled_from(_LITERALS[:6] if clean else _LITERALS),
        st.text(max_size=6).map(lambda s: json.dumps(s, ensure_ascii=clean)),
    )
    rare_deep = st.integers(0, 40).flatmap(
        lambda roll: st.sampled_from(_DEEP[:1] if clean else _DEEP) if roll == 0 else scalars
    )
    return st.recursive(
        rare_deep,
        lambda children: st.one_of(
            st.lists(children, max_size=3).map(lambda items: "[" + ",".join(items) + "]"),
            st.lists(st.tuples(keys(clean), children), max_size=3).map(
                lambda pairs: "{" + ",".join(f"{k}:{v}" for k, v in pairs) + "}"
            ),
        ),
        max_leaves=5,
    )


_WS = st.sampled_from(["", "", " ", "\n", " \t\r\n "])
_TOP = ["", "  ", "null", "[]", '"x"', "1", '[{"model":"m"}]', "{", '{"model"', '{"model":}']
_PREFIX = ["", "", " ", "\n\t", "\ufeff"]
_SUFFIX = ["", "", " ", "\n", " garbage", "}", ",", '{"model":"x"}', '"keep_alive"', "\x00"]
_BYTES = [b"\xff", b"\xc3", b"\xed\xa0\x80", b",", b"}", b'"', b"\\", b"{", b":", b" "]


@st.composite
def bodies(draw) -> bytes:
    """An object body; half of them clean (valid, no escaped or repeated keys), the rest
    with any of the hostile parts."""
    clean = draw(st.booleans())
    if not clean and draw(st.integers(0, 15)) == 0:
        return draw(st.sampled_from(_TOP)).encode()
    members = []
    if draw(st.integers(0, 4)):
        members.append(('"model"', draw(st.sampled_from(_STRINGS[16:23]))))
    for _ in range(draw(st.integers(0, 5))):
        if draw(st.booleans()):
            members.append((draw(keys(clean)), draw(values(clean))))
        else:
            members.append(('"keep_alive"', draw(st.sampled_from(_STRINGS[23:] + _NUMBERS[:5]))))
    if clean:  # at most one member for each field
        fields = [gojson.fold_key(json.loads(key)) for key, _ in members]
        members = [m for i, m in enumerate(members) if fields[i] not in fields[:i]]
    elif members and draw(st.integers(0, 3)) == 0:
        key, value = draw(st.sampled_from(members))
        again = draw(respelled(key))
        members.append((again, draw(st.sampled_from([value, '"x"', "5", "null", "{}"]))))
    members = draw(st.permutations(members))
    parts = [draw(_WS) + k + draw(_WS) + ":" + draw(_WS) + v + draw(_WS) for k, v in members]
    text = "{" + ",".join(parts) + ("" if parts else draw(_WS)) + "}"
    if clean:
        return (draw(_WS) + text + draw(st.sampled_from(_SUFFIX[:5]))).encode()
    text = draw(st.sampled_from(_PREFIX)) + text + draw(st.sampled_from(_SUFFIX))
    raw = text.encode("utf-8", "surrogatepass")
    roll = draw(st.integers(0, 9))
    if roll < 2:  # one hostile byte sequence somewhere, or one byte missing
        at = draw(st.integers(0, len(raw)))
        cut = at + (roll == 1)
        raw = raw[:at] + (b"" if roll == 1 else draw(st.sampled_from(_BYTES))) + raw[cut:]
    return raw


@settings(max_examples=1500, deadline=None)
@given(bodies())
def test_the_fast_reading_is_the_slow_reading_or_none(body):
    taken = [_check(body, struct) is not None for struct in STRUCTS]
    event("fast" if all(taken) else "slow" if not any(taken) else "mixed")


@settings(max_examples=600, deadline=None)
@given(bodies(), st.sampled_from(PATHS))
def test_the_adapter_classifies_and_rewrites_the_same_either_way(body, path):
    _classify_both(path, body)


# -- each place the one parse could read a body otherwise ------------------------------------


def _fast_and_slow(body: bytes, struct: Struct = GENERATE) -> tuple[Bound | None, object]:
    return read_fast(body, struct), _slow(body, struct)


TYPICAL = [
    b'{"model":"llama3.2","prompt":"Why is the sky blue?","stream":false}',
    b'{"model":"m","prompt":"x","options":{"temperature":0.7,"num_ctx":8192},"keep_alive":"10m"}',
    b'{ "model" : "m" , "keep_alive" : -1 , "prompt" : "x" }\n',
    b'{"Model":"m","PROMPT":"x","Keep_Alive":"5m"}',
    b'{"model":"m","prompt":"caf\\u00e9 \\u003cb\\u003e \\ud83d\\ude00 \xc3\xa9"}',
    b'{"model":"m","prompt":"\\ud800 lone"}',
    b'{"model":"m","prompt":"x","junk":1e400,"dup":1,"dup":2,"x":[{"y":null}]}',
    b'{"model":"m","options":{"num_ctx":1' + b"0" * 40 + b"}}",
    b'{"model":"m"} trailing bytes',
    b'{"\xe2\x84\xaaeep_alive":"2m","model":"m"}',
    b"{}",
    b'{"model":"m","prompt":"\xff\xc3 \xed\xa0\x80","pr\xffompt":5} \xff',
]


@pytest.mark.parametrize("body", TYPICAL)
def test_typical_and_harmless_bodies_take_the_fast_reading(body):
    fast, slow = _fast_and_slow(body)
    assert fast is not None
    _assert_same(fast, slow, GENERATE)
    for path in PATHS:
        _classify_both(path, body)


def test_a_body_ending_after_trailing_whitespace_keeps_its_place_for_the_rewrite():
    body = b' {"model":"m","prompt":"x" }\n'
    fast = read_struct(body, GENERATE)
    assert fast.close == len(body) - 2 and not fast.empty
    assert ADAPTER.classify("POST", "/api/generate", body, "").body == (
        b' {"model":"m","prompt":"x" ,"keep_alive":900}\n'
    )


@pytest.mark.parametrize(
    ("why", "body"),
    [
        ("an exact duplicate", b'{"model":"m","prompt":5,"prompt":"x"}'),
        ("a duplicate in another case", b'{"model":"m","MODEL":"n"}'),
        ("a duplicate spelled with escapes", b'{"prompt":5,"\\u0070rompt":"x","model":"m"}'),
        ("a key spelled with an escape", b'{"\\u006dodel":"m"}'),
        ("a Kelvin sign spelled with an escape", b'{"model":"m","\\u212aeep_alive":"2m"}'),
        ("a duplicated options map, merged by Go", b'{"model":"m","options":{},"Options":{}}'),
        ("a key's text in a value", b'{"model":"m","prompt":"\\"model"}'),
        ("a key's text nested", b'{"model":"m","x":{"model":1}}'),
        ("a key's text after the object", b'{"model":"m"} "model"'),
        ("NaN", b'{"model":"m","x":NaN}'),
        ("Infinity", b'{"model":"m","x":[Infinity]}'),
        ("-Infinity", b'{"model":"m","x":{"y":-Infinity}}'),
        ("an overflowing duration", b'{"model":"m","keep_alive":1e400}'),
        ("an overflowing option", b'{"model":"m","options":{"temperature":-1e400}}'),
        ("a string where Go wants a bool", b'{"model":"m","stream":"yes"}'),
        ("an int beyond int64", b'{"model":"m","top_logprobs":9223372036854775808}'),
        ("a byte order mark", b'\xef\xbb\xbf{"model":"m"}'),
        ("a trailing comma", b'{"model":"m",}'),
        ("a missing colon", b'{"model" "m"}'),
        (
            "nesting deeper than Python reads",
            b'{"model":"m","x":' + b"[" * 5000 + b"]" * 5000 + b"}",
        ),
        ("an array at the top", b'[{"model":"m"}]'),
        ("nothing", b" \n"),
        ("null", b"null"),
    ],
)
def test_bodies_the_one_parse_might_misread_take_the_slow_reading(why, body):
    fast, slow = _fast_and_slow(body)
    assert fast is None, why
    if isinstance(slow, Bound):
        assert repr(read_struct(body, GENERATE).values) == repr(slow.values)
    else:
        with pytest.raises(GoJsonError):
            read_struct(body, GENERATE)
    for path in PATHS:
        _classify_both(path, body)


def test_the_slow_reading_refuses_what_the_fast_one_left_to_it():
    with pytest.raises(GoJsonError, match="field prompt of type string"):
        read_struct(b'{"model":"m","prompt":5,"prompt":"x"}', GENERATE)
    with pytest.raises(gojson.EmptyBody):
        read_struct(b" ", GENERATE)


def test_the_fast_reading_places_keep_alive_as_the_slow_one_does():
    body = b'{"keep_alive" :\t"24h" ,\n "model":"m","prompt":"x"}'
    (member,) = read_struct(body, GENERATE).members("keep_alive")
    assert body[member.value_start : member.end] == b'"24h"'
    assert body[member.start : member.stop] == b'"keep_alive" :\t"24h" ,\n '
    sent = ADAPTER.classify("POST", "/api/generate", body, "").body
    assert sent == b'{"keep_alive" :\t900 ,\n "model":"m","prompt":"x"}'


def test_a_field_name_the_fast_reading_could_not_find_is_refused():
    with pytest.raises(ValueError, match="not ASCII letters"):
        Struct({"keep-alive": Kind.DURATION})
