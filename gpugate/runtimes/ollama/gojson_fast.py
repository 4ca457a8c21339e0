"""A body read into a Go request struct with one parse of the whole object.

Walking the top level member by member in Python costs several times the parse itself,
on every request that can load a model. The whole object is parsed in one call of the C
scanner when it cannot be deep (`gojson.shallow`), else by the non-recursive reader, and
member places are found only when a member is rewritten (`Bound.members`). The fields
bound once under their own name are kept apart (`Bound.single`): in that common case a
member's place is found without walking the top level, and a field's Go value is decoded
without Go's rules for duplicates (`govalues.decode_bound`).
"""

from __future__ import annotations

from gpugate.runtimes.ollama.gojson import (
    Bound,
    GoJsonError,
    decode_text,
    fold_key,
    go_string,
    scan_value,
    shallow_body,
)
from gpugate.runtimes.ollama.gotypes import GoKind, GoType, check


def read_struct(body: bytes, struct: GoType) -> Bound:
    """The body decoded into a struct's fields as Go decodes it; GoJsonError where Go fails."""
    text, pos = decode_text(body)
    if text[pos] != "{":
        raise GoJsonError("cannot unmarshal into a Go struct: the body is not an object")
    is_shallow = shallow_body(body)
    obj, end = scan_value(text, pos, is_shallow)
    values: dict[str, object] = {}
    names: dict[str, str] = {}
    fields, folded = struct.fields, struct.folded
    for key, value in obj:
        field = fields.get(key)
        if field is not None:
            name = key  # an exact match: field names are ASCII, so the key is as Go has it
        else:
            key = go_string(key)  # invalid UTF-8 or a lone surrogate can still fold
            found = folded.get(fold_key(key))
            if found is None:
                continue  # Go skips unknown fields without converting their values
            name, field = found, fields[found]
        names[key] = name
        if value is None:
            if field.nullable:
                values.pop(name, None)  # a pointer, slice or map set back to nil
            continue  # any other field is left as it was
        kind = field.kind
        if kind is GoKind.STRING:
            if type(value) is not str:
                check(value, field)  # raises Go's mismatch
        elif kind is not GoKind.BOOL or type(value) is not bool:
            check(value, field)
        if kind is GoKind.MAP:
            previous = values.get(name)
            merged = dict(previous) if isinstance(previous, dict) else {}
            merged.update(value)
            value = merged
        values[name] = value
    return Bound(
        values, text, end - 1, not obj, names, obj, kind=struct, raw=body, is_shallow=is_shallow
    )
