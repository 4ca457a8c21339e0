"""A body read into a Go request struct in one call of json's C scanner, where that
provably reads it as `gojson.read_object` and `gojson.bind` do.

Walking the top level member by member in Python costs several times the parse itself,
on every request that can load a model; most bodies need none of what the walk is for.
"""

from __future__ import annotations

import re

from gpugate.runtimes.gojson import DECODER, Bound, Struct, bind, fits, fold_key, read_object

_SCAN = DECODER.scan_once
_WS = re.compile(r"[ \t\n\r]*")


def read_struct(body: bytes, struct: Struct) -> Bound:
    """A body decoded into a struct's declared fields as Go decodes it (GoJsonError where
    Go fails): in one call of the C scanner where that provably reads it as Go does
    (`read_fast`), else member by member (`read_object`, `bind`)."""
    bound = read_fast(body, struct)
    return bind(read_object(body), struct) if bound is None else bound


_ESCAPED_NAME_RUNE = re.compile(
    r"\\u(?:00(?:3[0-9]|4[1-9A-Fa-f]|5[0-9AaFf]|6[1-9A-Fa-f]|7[0-9Aa])|212[Aa]|017[Ff])"
)
"""A `\\u` escape of a rune a field name can hold (ASCII letter, digit, underscore) or that
folds to one (Kelvin sign, long s): a key spelled with it has no plain spelling to find."""


def read_fast(body: bytes, struct: Struct) -> Bound | None:
    """What `bind(read_object(body), struct)` gives, from one parse of the whole object by
    the C scanner; None wherever that could differ (the caller then walks the top level).

    The scanner parses the same text (invalid UTF-8 kept as surrogate escapes, which can
    only be in keys no field matches or in values, kept as they are) with the same decoder
    `read_object` parses each key and value with, and its grammar for an object is
    `read_object`'s, so the two agree on what the body is and on every value in it,
    except where:

    * the first value is not an object, or does not parse (NaN, Infinity, a syntax error,
      nesting too deep): None, and `read_object` says why;
    * a field's member is duplicated: the dict keeps the last value only, where Go decodes
      (type-checks, merges) each. Keys that differ only in case are distinct keys of the
      dict, caught as two keys bound to one field. An exact duplicate is caught by its
      spelling: only a `\\uXXXX` escape can spell a rune of a key bound to a field, so
      with no such escape in the object (`_ESCAPED_NAME_RUNE`) each bound key occurs
      in the text as `"key"` at its place in the top level, and any second occurrence
      (a duplicate, or the same text nested, in a value or after the object) is None;
    * a value does not fit its field: None, for `bind` to word the error.

    Bytes after the object are not parsed, as in `read_object`. The one occurrence of
    each bound key is where its member starts; the rest of the member's place is found
    when asked for (`Bound.members`): only a member that is rewritten is scanned again.
    """
    text = body.decode("utf-8", "surrogateescape")
    pos = 0
    if not text.startswith("{"):
        pos = _WS.match(text).end()
        if not text.startswith("{", pos):
            return None
    try:
        obj, end = _SCAN(text, pos)
    except (StopIteration, ValueError, RecursionError):
        return None
    if "\\u" in text and _ESCAPED_NAME_RUNE.search(text, pos, end):
        return None
    fields, folded, types, quoted = struct.fields, struct.folded, struct.types, struct.quoted
    values: dict[str, object] = {}
    keys: dict[str, str] = {}
    for key, value in obj.items():
        name = key if key in fields else folded.get(fold_key(key))
        if name is None:
            continue
        # Counted in the whole text: an occurrence after the object only sends the body
        # the slow way.
        if name in values or text.count(quoted.get(key) or f'"{key}"') != 1:
            return None  # two spellings of one field, or a spelling that may be a duplicate
        if value is not None:
            expected = types[name]
            if type(value) is not expected if expected else not fits(value, fields[name]):
                return None
        values[name] = value
        keys[name] = key
    return Bound(values, text, end - 1, not obj, keys=keys)
