"""What a Go value holds after encoding/json decodes a JSON value into it, given what it held
before: the last of duplicate members does not simply replace the first.

Go 1.26's decode.go decodes each member into the field it finds, as it is:

* `null` sets a pointer, slice, map or interface to nil and leaves anything else alone
  (literalStore), so a struct keeps its fields and a string its text;
* an object decodes into the struct already there, field by field (object()): what the
  second object leaves out, the first one's value keeps; a type with its own UnmarshalJSON
  that makes a new value (api.Message) is replaced instead;
* an array decodes into the slice already there, element by element (array()): element i
  is decoded into what the slice's backing array holds at i, even past the old length
  (SetLen does not clear), then the slice is cut to the array's length; `[]` makes a new
  empty slice;
* an interface{} (and a map[string]any value) is made anew.

A type mismatch leaves the value as it was (decoding saves the error and goes on).
"""

from __future__ import annotations

import re

from gpugate.sim.ollama.messages import Leaf, Shape, member_key

_SURROGATES = re.compile("[\ud800-\udfff]")
_NULLABLE = (Leaf.ANY, Leaf.IMAGE, Leaf.PROPERTIES)
_KINDS = {Leaf.STRING: (str,), Leaf.INT: (int,), Leaf.BOOL: (bool,), Leaf.FLOAT: (int, float)}


class Pairs(list[tuple[str, object]]):
    """A JSON object as its members in order, duplicates included; the top-level one
    also knows where each member's value is in the text."""

    text: str = ""
    spans: list[tuple[int, int]] | None = None

    def raw(self, index: int) -> str:
        assert self.spans is not None
        start, end = self.spans[index]
        return self.text[start:end]


class GoSlice(list[object]):
    """A decoded Go slice: its elements, and what its backing array holds past them."""

    stale: list[object]

    def __init__(self, items: list[object] | None = None, stale: list[object] | None = None):
        super().__init__(items or [])
        self.stale = stale or []


def go_text(text: str) -> str:
    """A decoded JSON string as Go holds it: lone surrogates are U+FFFD."""
    return text if text.isascii() else _SURROGATES.sub("\ufffd", text)


def plain(value: object) -> object:
    """Decoded members as Go holds them in a map or interface{}: last duplicate wins.
    Without recursion: a value may nest 10000 deep."""
    root: list[object] = [value]
    stack: list[tuple[list | dict, int | str]] = [(root, 0)]
    while stack:
        holder, slot = stack.pop()
        item = holder[slot]
        if isinstance(item, Pairs):
            made: dict[str, object] = {}
            for k, v in item:
                made[go_text(k)] = v
            holder[slot] = made
            stack.extend((made, k) for k in made)
        elif isinstance(item, list):
            copied = list(item)
            holder[slot] = copied
            stack.extend((copied, i) for i in range(len(copied)))
        elif isinstance(item, str):
            holder[slot] = go_text(item)
    return root[0]


Spec = Leaf | Shape | tuple[str, "Leaf | Shape"]


def decode_into(old: object, raw: object, spec: Spec) -> object:
    """What a Go value of type `spec` that held `old` holds after decoding `raw` (the
    scanner's value: objects as Pairs) into it. Structs are dicts by field name."""
    if isinstance(spec, Leaf):
        if raw is None:
            return None if spec in _NULLABLE else old
        kinds = _KINDS.get(spec)
        if kinds is not None and (isinstance(raw, bool) is not (spec is Leaf.BOOL)):
            return old
        if kinds is not None and not isinstance(raw, kinds):
            return old
        return plain(raw)
    if isinstance(spec, Shape):
        if raw is None:
            return {} if spec.fresh else (None if spec.pointer else old)
        if not isinstance(raw, Pairs):
            return old
        held = {} if spec.fresh or not isinstance(old, dict) else dict(old)
        for key, member in raw:
            name = member_key(spec, go_text(key))
            if name is not None:
                held[name] = decode_into(held.get(name), member, spec.fields[name])
        return held
    _, elem = spec
    if raw is None:
        return None
    if not isinstance(raw, list):
        return old
    if not raw:
        return GoSlice()
    backing = list(old) + old.stale if isinstance(old, GoSlice) else list(old or [])
    for index, item in enumerate(raw):
        before = backing[index] if index < len(backing) else None
        value = decode_into(before, item, elem)
        if index < len(backing):
            backing[index] = value
        else:
            backing.append(value)
    return GoSlice(backing[: len(raw)], backing[len(raw) :])
