"""What a Go field holds after its JSON members were decoded into it, duplicates included.

`gotypes.check` answers whether Go's decoder fails; this module answers what it leaves in
the fields the pre-load checks read. Go decodes every duplicate member into the value the
previous one left (encoding/json decode.go, Go 1.26, the release Ollama v0.24.0 builds
with):

* a struct (or a non-nil pointer to one) is decoded into field by field: fields the later
  object does not name keep what the earlier one put there;
* a slice keeps its backing array: array() decodes element i into the element already at
  i (merged as above) and only truncates the length at the end, so elements past the
  length of a shorter array come back, as they were, when a later array is longer; an
  empty array makes a new empty slice and null makes it nil;
* a map keeps its entries, each value decoded fresh into a zeroed element;
* an interface{}, a json.RawMessage and a type with its own UnmarshalJSON are replaced.

Values come in as the scanner gives them (objects are tuples of pairs) and go out as Go
holds them: a struct is a dict of the fields set, a slice a `GoSlice`, a map or an
interface{} object a dict (last duplicate wins), the zero value or nil None.
"""

from __future__ import annotations

from gpugate.runtimes.ollama.gojson import fold_key
from gpugate.runtimes.ollama.gotypes import GoKind, GoType


class GoSlice(list):
    """A slice's elements, and the elements past its length still in its backing array."""

    spare: tuple[object, ...] = ()


def plain(value: object) -> object:
    """An interface{} value: objects become dicts (last duplicate wins), without recursion."""
    if type(value) is tuple:
        root: list = [None]
        stack: list[tuple[object, object, object]] = [(value, root, 0)]
    elif type(value) is list:
        root = [None]
        stack = [(value, root, 0)]
    else:
        return value
    while stack:
        source, target, slot = stack.pop()
        if type(source) is tuple:
            made: dict = {}
            target[slot] = made
            for key, member in source:
                if type(member) is tuple or type(member) is list:
                    made[key] = None
                    stack.append((member, made, key))
                else:
                    made[key] = member
        else:
            items = list(source)
            target[slot] = items
            for index, member in enumerate(items):
                if type(member) is tuple or type(member) is list:
                    stack.append((member, items, index))
    return root[0]


def as_pairs(value: object) -> object:
    """A plain value back in the scanner's form (dicts as tuples of pairs), to re-check it
    as Go does after json.Marshal of a map[string]any."""
    if type(value) is not dict and type(value) is not list:
        return value
    # Post-order without recursion: a container is rebuilt once its children are.
    done: dict[int, object] = {}
    stack: list[tuple[object, bool]] = [(value, False)]
    while stack:
        node, ready = stack.pop()
        children = node.values() if type(node) is dict else node
        if not ready:
            stack.append((node, True))
            stack.extend((c, False) for c in children if type(c) is dict or type(c) is list)
            continue
        rebuilt = [done.get(id(c), c) for c in children]
        done[id(node)] = tuple(zip(node, rebuilt, strict=True)) if type(node) is dict else rebuilt
    return done[id(value)]


def field_name(kind: GoType, key: str) -> str | None:
    """The struct field a member with this key is decoded into (exact, else folded)."""
    if key in kind.fields:
        return key
    return kind.folded.get(fold_key(key))


def decode(value: object, kind: GoType, held: object = None) -> object:
    """What a `kind` that held `held` holds after Go decodes `value` (already checked with
    `gotypes.check`) into it. Recursion follows the declared type, not the JSON."""
    k = kind.kind
    if value is None:
        # null: a pointer, slice, map or interface becomes nil; a type with UnmarshalJSON
        # is reset by it (the ones the requests reach take null as their zero value).
        return None if kind.nullable or k is GoKind.CUSTOM else held
    if k is GoKind.STRUCT:
        made = dict(held) if type(held) is dict and not kind.fresh else {}
        for key, member in value:
            name = field_name(kind, key)
            if name is None:
                continue
            decoded = decode(member, kind.fields[name], made.get(name))
            if decoded is None:
                made.pop(name, None)
            else:
                made[name] = decoded
        return made
    if k is GoKind.SLICE:
        if not value:
            return GoSlice()  # a new empty slice: the old backing array is gone
        backing = list(held) + list(held.spare) if type(held) is GoSlice else []
        elem = kind.elem
        for index, item in enumerate(value):
            if index < len(backing):
                backing[index] = decode(item, elem, backing[index])
            else:
                backing.append(decode(item, elem, None))
        made_slice = GoSlice(backing[: len(value)])
        made_slice.spare = tuple(backing[len(value) :])
        return made_slice
    if k is GoKind.MAP:
        made = dict(held) if type(held) is dict else {}
        elem = kind.elem
        for key, member in value:
            made[key] = decode(member, elem, None)
        return made
    if k is GoKind.ANY:
        return plain(value)
    if k is GoKind.CUSTOM and kind.decoder is not None:
        return kind.decoder(value, held)
    return value  # scalars, bytes, raw JSON and custom types: replaced


def decode_members(pairs: object, kind: GoType, name: str) -> object:
    """What struct field `name` holds after every member of the object that Go decodes
    into it, in order."""
    held = None
    if type(pairs) is not tuple:
        return held
    field = kind.fields[name]
    for key, member in pairs:
        if field_name(kind, key) == name:
            held = decode(member, field, held)
    return held
