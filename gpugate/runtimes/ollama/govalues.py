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

from gpugate.runtimes.ollama.gojson import Bound, fold_key
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


DECLINED = object()
"""`decode_fresh`'s answer for a value outside the common case."""
_SCALARS = (
    GoKind.STRING,
    GoKind.BOOL,
    GoKind.INT,
    GoKind.INT32,
    GoKind.UINT8,
    GoKind.FLOAT64,
    GoKind.FLOAT32,
    GoKind.RAW,
    GoKind.BYTES,
)
"""Kinds `decode` replaces with the value as it is (null aside); a tuple, as `in` on it
compares by identity first where a set would call Enum's hash."""


def decode_fresh(value: object, kind: GoType) -> object:
    """What `decode(value, kind)` (nothing held before) gives, when every object the
    declared tree decodes into a struct names each field once and by its own name, or
    DECLINED. Nothing merges in that case: no key is folded and nothing is held when a
    member is decoded (a null, or a value decoding to nothing, leaves its field unset)."""
    if value is None:
        return None  # nil, or the zero value held before: nothing
    k = kind.kind
    if k in _SCALARS:
        return value
    if k is GoKind.STRUCT:
        return _struct_fresh(value, kind)
    if k is GoKind.SLICE:
        elem = kind.elem
        items = GoSlice()
        struct_elem = elem.kind is GoKind.STRUCT
        for item in value:
            if item is None:
                decoded = None
            elif struct_elem:
                decoded = _struct_fresh(item, elem)
            else:
                decoded = decode_fresh(item, elem)
            if decoded is DECLINED:
                return DECLINED
            items.append(decoded)
        return items
    return decode(value, kind)  # maps, interfaces, custom types: nothing held to merge


def _struct_fresh(value: object, kind: GoType) -> object:
    fields = kind.fields
    made: dict[str, object] = {}
    for key, member in value:
        field = fields.get(key)
        if field is None:
            if fold_key(key) in kind.folded:
                return DECLINED  # a key Go folds onto a field
            continue
        if key in made:
            return DECLINED  # Go decodes a duplicate into what the first one left
        if member is None:
            # Unset, as decode leaves it: a later duplicate is then decoded into nothing,
            # which is what it is decoded into here.
            continue
        field_kind = field.kind
        if field_kind in _SCALARS:
            made[key] = member
        elif field_kind is GoKind.ANY and type(member) is not tuple and type(member) is not list:
            made[key] = member  # plain() of a scalar is itself
        else:
            decoded = decode_fresh(member, field)
            if decoded is DECLINED:
                return DECLINED
            if decoded is not None:
                made[key] = decoded
    return made


def decode_bound(bound: Bound, kind: GoType, name: str) -> object:
    """`decode_members(bound.pairs, kind, name)`: what struct field `name` holds, read
    without Go's rules for duplicates when the body is in the common case."""
    if bound.kind is kind:
        if name in bound.single:
            decoded = decode_fresh(bound.single[name], kind.fields[name])
            if decoded is not DECLINED:
                return decoded
        elif name not in bound.names.values():
            return None  # no member is decoded into it: it holds nothing
    return decode_members(bound.pairs, kind, name)
