"""A request body read the way Go's encoding/json reads it into a runtime's request struct.

Ollama binds bodies with one `json.Decoder.Decode` into a Go struct, and that reading
differs from Python's `json.loads` where it matters for admission:

* object keys match struct fields case-insensitively (fold.go: ASCII letters, plus the
  Kelvin sign for K and the long s for S), duplicates are all decoded and the last wins;
  a JSON `null` leaves a field as it was;
* strings may hold invalid UTF-8 and lone surrogate escapes (both become U+FFFD);
* NaN and Infinity are not JSON, and a number that overflows float64 is an error where
  it is decoded into a number or an `interface{}` (and ignored in an unknown field);
* nesting is allowed to 10000 levels;
* bytes after the first JSON value are never read.

Values are kept as the scanner gives them with `object_pairs_hook=tuple`: an object is a
tuple of `(key, value)` pairs with every duplicate, an array a list. `read_object` walks
the top level and keeps where each member sits, so a caller can rewrite (`splice`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable

import attrs

from gpugate.runtimes.ollama.gojson_scan import ScanError, parse_int, scan

_WS = re.compile(r"[ \t\n\r]*")
_COLON = re.compile(r"[ \t\n\r]*:[ \t\n\r]*")
_AFTER_VALUE = re.compile(r"[ \t\n\r]*(?:,[ \t\n\r]*(?=\")|\})")
_SURROGATES = re.compile("[\ud800-\udfff]")
_FOLDS = str.maketrans({"\u212a": "K", "\u017f": "S"})
SHALLOW = 500
"""A text with at most this many `[` and `{` cannot nest deeper: the C scanner reads it
(it recurses once per level, and gives up near a thousand)."""


class GoJsonError(ValueError):
    """Go's decoder refuses the body: Ollama answers 400 without loading anything."""


class EmptyBody(GoJsonError):
    """Nothing but whitespace: io.EOF, Ollama's "missing request body"."""


def _reject_constant(name: str) -> object:
    raise GoJsonError(f"invalid character in literal {name}")


DECODER = json.JSONDecoder(
    parse_int=parse_int, parse_constant=_reject_constant, object_pairs_hook=tuple
)
"""The C scanner's reading: NaN and Infinity refused, objects as tuples of pairs."""
_SCAN = DECODER.scan_once


def shallow(text: str) -> bool:
    """Whether the text cannot nest deeper than the C scanner safely recurses."""
    return len(text) <= SHALLOW or text.count("[") + text.count("{") <= SHALLOW


def shallow_body(body: bytes) -> bool:
    """`shallow` of the body's text, counted in its bytes (`[` and `{` are one byte each in
    UTF-8 and never part of another character's; a byte that is not UTF-8 decodes to a
    surrogate escape of its own): one pass over a byte per character."""
    return len(body) <= SHALLOW or body.count(b"[") + body.count(b"{") <= SHALLOW


def scan_value(text: str, pos: int, is_shallow: bool) -> tuple[object, int]:
    """The JSON value at `pos` and the index after it; GoJsonError where Go refuses it."""
    try:
        if is_shallow:
            return _SCAN(text, pos)
        return scan(text, pos)
    except StopIteration:
        raise GoJsonError("invalid character looking for beginning of value") from None
    except (ValueError, ScanError) as exc:
        raise GoJsonError(str(exc)) from None


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


def decode_text(body: bytes) -> tuple[str, int]:
    """The body as text and the index of its first value; GoJsonError if none."""
    text = body.decode("utf-8", "surrogateescape")
    pos = _WS.match(text).end()
    if pos == len(text):
        raise EmptyBody("EOF")
    return text, pos


def read_object(body: bytes) -> TopLevel:
    """The first JSON value of the body, which must be an object, read as Go reads it."""
    text, pos = decode_text(body)
    if text[pos] != "{":
        raise GoJsonError("the body is not a JSON object")
    is_shallow = shallow(text)
    members: list[Member] = []
    pos = _WS.match(text, pos + 1).end()
    if text.startswith("}", pos):
        return TopLevel(text, (), pos)
    while True:
        if not text.startswith('"', pos):
            raise GoJsonError("invalid character looking for beginning of object key")
        key, colon = scan_value(text, pos, True)
        after_colon = _COLON.match(text, colon)
        if after_colon is None:
            raise GoJsonError("invalid character after object key")
        value_start = after_colon.end()
        value, end = scan_value(text, value_start, is_shallow)
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


@attrs.define
class Bound:
    """The declared top-level fields of a struct after Go's decoding (absent: not in
    `values`). Objects in values are tuples of pairs, but a map field's duplicates are
    merged into one dict, as Go decodes a second object into the map the first made."""

    values: dict[str, object]
    text: str
    """The body as text; invalid UTF-8 is kept as surrogate escapes, to give it back."""
    close: int
    """Index of the top-level object's closing brace."""
    empty: bool
    """Whether the object has no members at all (known or not)."""
    names: dict[str, str]
    """Each top-level key that was decoded into a field, and the field."""
    pairs: tuple = ()
    """The top-level object as the scanner read it: every `(key, value)` in order."""
    kind: object = None
    """The struct the body was read into (`single` names its fields)."""
    raw: bytes = b""
    """The body's bytes, which `text` encodes back to (b"": not kept, `splice` encodes
    `text`)."""
    is_shallow: bool | None = None
    """`shallow(text)`, once counted (None: not yet)."""
    _single: dict[str, object] | None = None
    _found: dict[str, tuple[Member, ...]] | None = None

    @property
    def single(self) -> dict[str, object]:
        """The fields exactly one top-level member was decoded into, that member's key
        being the field's own name, with the member's value as the scanner read it: the
        common case, which `members` and `govalues.decode_bound` read without walking the
        body. Counted when first asked (a key that maps to a field is in `names` as the
        scanner read it: one with a lone surrogate maps to none)."""
        if self._single is None:
            counts: dict[str, int] = {}
            own: dict[str, object] = {}
            names = self.names
            for key, value in self.pairs:
                name = names.get(key)
                if name is not None:
                    counts[name] = counts.get(name, 0) + 1
                    if key == name:
                        own[name] = value
            self._single = {name: own[name] for name, n in counts.items() if n == 1 and name in own}
        return self._single

    def get(self, field: str, default: object = None) -> object:
        return self.values.get(field, default)

    def members(self, field: str) -> tuple[Member, ...]:
        """Every member that was decoded into `field`, in order, with its place in the text."""
        if field not in self.names.values():
            return ()  # no member was bound to it: nothing to walk the top level for
        located = self.locate(field)
        return located if located is not None else self.walked(field)

    def locate(self, field: str) -> tuple[Member, ...] | None:
        """`walked(field)` without walking the top level, in the common case; None (the
        caller walks) when the body is not that case.

        The one member of `field` is written `"field"` when the text holds no `\\u00`
        escape of an ASCII character: a field name is ASCII letters, digits and `_`,
        which no other escape decodes to. Found exactly once in the whole text, it is that
        member.
        """
        if field not in self.single:
            return None
        text = self.text
        if "\\u" in text and _ASCII_ESCAPE.search(text) is not None:
            return None
        # The member's key is written `"field"` (above), so the text holds it at least
        # once: found once, it is that key. Found again anywhere (a nested object's key,
        # a string value, the end of a key with an escaped quote), the top level is walked.
        quoted = '"' + field + '"'
        start = text.find(quoted)
        if start < 0 or text.find(quoted, start + 1) >= 0:
            return None
        found = _COLON.match(text, start + len(quoted))
        if found is None:
            return None
        value_start = found.end()
        if self.is_shallow is None:
            self.is_shallow = shallow(text)
        value, end = scan_value(text, value_start, self.is_shallow)
        after = _AFTER_VALUE.match(text, end)
        if after is None:
            return None
        stop = after.end()
        last = text[stop - 1] == "}"
        return (Member(field, value, start, value_start, end, stop - 1 if last else stop),)

    def walked(self, field: str) -> tuple[Member, ...]:
        """Every member decoded into `field`, found by walking the top level as Go does."""
        if self._found is None:
            found: dict[str, list[Member]] = {}
            doc = read_object(self.text.encode("utf-8", "surrogateescape"))
            for member in doc.members:
                name = self.names.get(member.key)
                if name is not None:
                    found.setdefault(name, []).append(member)
            self._found = {name: tuple(members) for name, members in found.items()}
        return self._found.get(field, ())


_ASCII_ESCAPE = re.compile(r"\\u00[0-7]")
"""A `\\u` escape of an ASCII character: the only escape that can spell part of a name."""


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
    # The kept bytes are copied from the body as it came: a long body (a chat's history)
    # is not encoded again around a few edited bytes.
    raw = bound.raw or text.encode("utf-8", "surrogateescape")
    byte_at = _byte_index(text, raw)
    pieces = []
    pos = 0
    for start, end, replacement in edits:
        pieces.append(raw[pos : byte_at(start)])
        pieces.append(replacement.encode("utf-8", "surrogateescape"))
        pos = byte_at(end)
    pieces.append(raw[pos:])
    return b"".join(pieces)


def _byte_index(text: str, raw: bytes) -> Callable[[int], int]:
    """Where each index of `text` falls in `raw`, the bytes it was decoded from (UTF-8,
    invalid bytes kept as surrogate escapes, so encoding gives the bytes back exactly):
    the same index in an ASCII body; otherwise counted from the nearer end."""
    if len(text) == len(raw):
        return _same_index
    half = len(text) // 2

    def byte_at(index: int) -> int:
        if index <= half:
            return len(text[:index].encode("utf-8", "surrogateescape"))
        return len(raw) - len(text[index:].encode("utf-8", "surrogateescape"))

    return byte_at


def _same_index(index: int) -> int:
    return index
