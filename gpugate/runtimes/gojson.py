"""A request body read the way Go's encoding/json reads it into a runtime's request struct.

Ollama binds bodies with one `json.Decoder.Decode` into a Go struct, and that reading
differs from Python's `json.loads` where it matters for admission:

* object keys match struct fields case-insensitively (fold.go: ASCII letters, plus the
  Kelvin sign for K and the long s for S), duplicates are all decoded and the last wins;
  a JSON `null` leaves a pointer field nil;
* strings may hold invalid UTF-8 and lone surrogate escapes (both become U+FFFD);
* NaN and Infinity are not JSON, and a number that overflows float64 is an error where
  it is decoded into a number or an `interface{}` (and ignored in an unknown field);
* bytes after the first JSON value are never read.

`read_object` makes one pass over the top level and keeps, for every member, its key,
its value and where it sits in the text, so a caller can classify from the same
reading it rewrites from (`splice`). Values are decoded by the C scanner of `json`.
`gojson_fast.read_struct` reads most bodies in one call of that scanner instead.
"""

from __future__ import annotations

import enum
import json
import math
import re
from collections.abc import Iterable, Mapping

import attrs

_WS = re.compile(r"[ \t\n\r]*")
_COLON = re.compile(r"[ \t\n\r]*:[ \t\n\r]*")
_AFTER_VALUE = re.compile(r"[ \t\n\r]*(?:,[ \t\n\r]*(?=\")|\})")
_SURROGATES = re.compile("[\ud800-\udfff]")
_INT64 = 2**63
_FOLDS = str.maketrans({"\u212a": "K", "\u017f": "S"})


class GoJsonError(ValueError):
    """Go's decoder refuses the body: Ollama answers 400 without loading anything."""


class EmptyBody(GoJsonError):
    """Nothing but whitespace: io.EOF, Ollama's "missing request body"."""


def _reject_constant(name: str) -> object:
    raise GoJsonError(f"invalid character in literal {name}")


def _parse_int(text: str) -> int | float:
    # Long literals go through float (Python refuses very long ints; Go never
    # holds an integer beyond float64 or int64 anyway).
    return int(text) if len(text) <= 40 else float(text)


DECODER = json.JSONDecoder(parse_int=_parse_int, parse_constant=_reject_constant)
"""The decoder every key and value is parsed with (NaN and Infinity refused)."""
_SCAN = DECODER.scan_once


def go_string(text: str) -> str:
    """A Python-decoded JSON string as Go decodes it: surrogates become U+FFFD."""
    return text if text.isascii() else _SURROGATES.sub("\ufffd", text)


def fold_key(key: str) -> str:
    """The folded form Go's decoder compares struct field names in (fold.go foldName).

    Exact for any key that can match an ASCII field name: ASCII letters fold to upper
    case, and U+212A KELVIN SIGN and U+017F LATIN SMALL LETTER LONG S fold to K and S
    (the only non-ASCII runes in the simple-fold orbit of an ASCII letter). Any other
    non-ASCII rune folds to a non-ASCII rune in Go, so a key still holding one after
    that is returned as it is: it matches no ASCII field. (Python's `upper` would fold
    it too far: "ß" to "SS", "ı" to "I", the ligature "ﬆ" to "ST".)
    """
    if key.isascii():
        return key.upper()
    key = go_string(key).translate(_FOLDS)
    return key.upper() if key.isascii() else key


@attrs.frozen(slots=True)
class Member:
    """One top-level `"key": value` of an object, with its place in the text."""

    key: str
    """Decoded as Go decodes it."""
    value: object
    start: int
    """Index of the key's opening quote."""
    value_start: int
    end: int
    """Index just past the value."""
    stop: int
    """Index of the next member's opening quote, or of the closing brace after the last."""


@attrs.frozen
class TopLevel:
    """A body's top-level object: its text and its members in order."""

    text: str
    """The body as text; invalid UTF-8 is kept as surrogate escapes, to give it back."""
    members: tuple[Member, ...]
    close: int
    """Index of the closing brace."""

    def matching(self, field: str) -> list[Member]:
        """Every member Go decodes into the struct field `field` (in order)."""
        folded = field.upper()
        return [m for m in self.members if m.key == field or fold_key(m.key) == folded]


def read_object(body: bytes) -> TopLevel:
    """The first JSON value of the body, which must be an object, read as Go reads it."""
    text = body.decode("utf-8", "surrogateescape")
    pos = _WS.match(text).end()
    if pos == len(text):
        raise EmptyBody("EOF")
    if text[pos] != "{":
        raise GoJsonError("the body is not a JSON object")
    members: list[Member] = []
    pos = _WS.match(text, pos + 1).end()
    if text.startswith("}", pos):
        return TopLevel(text, (), pos)
    try:
        while True:
            if not text.startswith('"', pos):
                raise GoJsonError("invalid character looking for beginning of object key")
            key, colon = _SCAN(text, pos)
            after_colon = _COLON.match(text, colon)
            if after_colon is None:
                raise GoJsonError("invalid character after object key")
            value_start = after_colon.end()
            value, end = _SCAN(text, value_start)
            after = _AFTER_VALUE.match(text, end)
            if after is None:
                raise GoJsonError("invalid character after object key:value pair")
            start, pos = pos, after.end()
            last = text[pos - 1] == "}"
            members.append(
                Member(go_string(key), value, start, value_start, end, pos - 1 if last else pos)
            )
            if last:
                return TopLevel(text, tuple(members), pos - 1)
    except StopIteration:
        raise GoJsonError("invalid character looking for beginning of value") from None
    except (json.JSONDecodeError, RecursionError) as exc:
        raise GoJsonError(str(exc)) from None


# -- binding into a struct -------------------------------------------------------------------


class Kind(enum.Enum):
    """The Go type of a request struct field, as far as admission needs to know it."""

    STRING = "string"
    BOOL = "bool"
    INT = "int"
    ARRAY = "slice"
    MAP = "map[string]interface {}"
    """Duplicates merge: Go decodes a second object into the map the first one made."""
    ANY = "interface {}"
    DURATION = "api.Duration"
    """A pointer: null leaves it nil; the value itself is checked by its parser."""


def fits(value: object, kind: Kind) -> bool:
    """Whether Go decodes a value into a field of this kind without an error."""
    if value is None:
        return True  # null into a non-pointer is a no-op in Go
    if kind is Kind.STRING:
        return isinstance(value, str)
    if kind is Kind.BOOL:
        return isinstance(value, bool)
    if kind is Kind.INT:
        return type(value) is int and -_INT64 <= value < _INT64
    if kind is Kind.ARRAY:
        return isinstance(value, list)
    if kind is Kind.MAP:
        return isinstance(value, dict) and _finite(value)
    if kind is Kind.DURATION:
        return not isinstance(value, float) or math.isfinite(value)
    return _finite(value)


_SIMPLE = {Kind.STRING: str, Kind.BOOL: bool, Kind.ARRAY: list}
"""The kinds `fits` checks by type alone (the json scanner's types are exact)."""


def _finite(value: object) -> bool:
    """Whether every number in a value decoded into interface{} fits a float64.

    The value is the json scanner's, so its types are exact (no subclasses to look for).
    """
    kind = type(value)
    if kind is float:
        return math.isfinite(value)
    if kind is dict:
        value = value.values()
    elif kind is not list:
        return True
    for item in value:
        kind = type(item)
        if kind is float:
            if not math.isfinite(item):
                return False
        elif (kind is dict or kind is list) and not _finite(item):
            return False
    return True


_FIELD_NAME = re.compile(r"[A-Za-z0-9_]+")


@attrs.frozen
class Struct:
    """A Go request struct: the declared fields admission reads, by name and folded name."""

    fields: Mapping[str, Kind] = attrs.field()
    folded: Mapping[str, str] = attrs.field(init=False)
    types: Mapping[str, type | None] = attrs.field(init=False)
    """The type a field's non-null value must have, for the kinds `fits` checks by type
    alone (looked up by name: hashing an enum member runs Python code)."""
    quoted: Mapping[str, str] = attrs.field(init=False)
    """Each field's name as a JSON string, the spelling the fast reading counts."""

    @fields.validator
    def _names(self, _attribute: object, fields: Mapping[str, Kind]) -> None:
        # The fast reading finds keys by their plain spelling (gojson_fast).
        for name in fields:
            if not _FIELD_NAME.fullmatch(name):
                raise ValueError(f"field name {name!r} is not ASCII letters, digits, underscore")

    @folded.default
    def _fold(self) -> Mapping[str, str]:
        return {name.upper(): name for name in self.fields}

    @types.default
    def _types(self) -> Mapping[str, type | None]:
        return {name: _SIMPLE.get(kind) for name, kind in self.fields.items()}

    @quoted.default
    def _quoted(self) -> Mapping[str, str]:
        return {name: f'"{name}"' for name in self.fields}


@attrs.define
class Bound:
    """The declared fields of a struct after Go's decoding (absent: not in `values`).

    Not frozen: a frozen class's `__init__` sets each attribute through
    `object.__setattr__`, which would add a fifth to the fast reading's cost.
    """

    values: Mapping[str, object]
    text: str
    """The body as text; invalid UTF-8 is kept as surrogate escapes, to give it back."""
    close: int
    """Index of the top-level object's closing brace."""
    empty: bool
    """Whether the object has no members at all (known or not)."""
    _found: Mapping[str, tuple[Member, ...]] = attrs.field(factory=dict)
    """Every member decoded into each field, as read_object found them."""
    _keys: Mapping[str, str] = attrs.field(factory=dict)
    """The fast reading's instead: each field's one member's key, which the text spells
    `"key"` exactly once (gojson_fast)."""

    def get(self, field: str, default: object = None) -> object:
        return self.values.get(field, default)

    def members(self, field: str) -> tuple[Member, ...]:
        """Every member that was decoded into `field`, in order, with its place in the text."""
        found = self._found.get(field)
        if found is not None:
            return found
        key = self._keys.get(field)
        if key is None:
            return ()
        text = self.text
        start = text.index(f'"{key}"')
        value_start = _COLON.match(text, start + len(key) + 2).end()
        end = _SCAN(text, value_start)[1]
        stop = _AFTER_VALUE.match(text, end).end()
        if text[stop - 1] == "}":
            stop -= 1
        return (Member(go_string(key), self.values[field], start, value_start, end, stop),)


def bind(doc: TopLevel, struct: Struct) -> Bound:
    """Decode the top level into a struct's declared fields; GoJsonError where Go fails."""
    fields, folded = struct.fields, struct.folded
    values: dict[str, object] = {}
    members: dict[str, list[Member]] = {}
    for member in doc.members:
        name = member.key if member.key in fields else folded.get(fold_key(member.key))
        if name is None:
            continue  # Go skips unknown fields without converting their values
        kind = fields[name]
        if not fits(member.value, kind):
            raise GoJsonError(f"cannot unmarshal into Go struct field {name} of type {kind.value}")
        members.setdefault(name, []).append(member)
        value = member.value
        if kind is Kind.MAP and isinstance(value, dict):
            previous = values.get(name)
            value = {**previous, **value} if isinstance(previous, dict) else value
        values[name] = value
    found = {k: tuple(v) for k, v in members.items()}
    return Bound(values, doc.text, doc.close, not doc.members, found)


# -- rewriting -------------------------------------------------------------------------------


def splice(bound: Bound, keep: Member | None, value: str, drop: Iterable[Member]) -> bytes:
    """The body with `keep`'s value replaced by `value` and the `drop` members removed.

    `keep` None appends `"key": value` as a new last member, where `value` then is the
    whole member text. Every byte outside the edited members is kept; a dropped member
    always has a later member (the kept one), so it goes with the comma after it.
    """
    text = bound.text
    edits = [(member.start, member.stop, "") for member in drop]
    if keep is not None:
        edits.append((keep.value_start, keep.end, value))
    else:
        edits.append((bound.close, bound.close, ("" if bound.empty else ",") + value))
    edits.sort()
    parts = []
    pos = 0
    for start, end, replacement in edits:
        parts.append(text[pos:start])
        parts.append(replacement)
        pos = end
    parts.append(text[pos:])
    return "".join(parts).encode("utf-8", "surrogateescape")
