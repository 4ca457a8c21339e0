"""Go types of request fields, and whether Go's decoder fills them from a JSON value.

Values are the scanner's: objects are tuples of `(key, value)` pairs in text order (every
duplicate kept, as Go decodes every duplicate), arrays are lists. A mismatch anywhere in
the declared tree makes `Decode` fail in Go, so `check` walks the whole tree, with a
stack rather than recursion (a value can be 10000 levels deep).
"""

from __future__ import annotations

import enum
import math
import re
from collections.abc import Callable

import attrs

from gpugate.runtimes.ollama.gojson import GoJsonError, fold_key

_INT64 = 2**63
_INT32 = 2**31
_FLOAT32_OVERFLOW = 2.0**128 - 2.0**103
"""Half an ulp above float32's largest finite value: strconv.ParseFloat(s, 32) overflows
from here on (ties round to even, which is 2**128)."""
_BASE64 = re.compile(r"(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?")
"""base64.StdEncoding, which encoding/json decodes []byte with: padded, trailing bits free."""


class GoKind(enum.Enum):
    STRING = "string"
    BOOL = "bool"
    INT = "int"
    INT32 = "int32"
    UINT8 = "uint8"
    FLOAT64 = "float64"
    FLOAT32 = "float32"
    ANY = "interface {}"
    """Numbers become float64: one beyond it is an error."""
    RAW = "json.RawMessage"
    """Any valid JSON, kept as it is."""
    BYTES = "[]uint8"
    """A base64 string, or an array of bytes."""
    SLICE = "slice"
    MAP = "map"
    """String keys, exact (no folding); every value converted to `elem`."""
    STRUCT = "struct"
    CUSTOM = "custom"
    """A type with its own UnmarshalJSON: `accepts` decides."""


_PLAIN_TYPES: dict[GoKind, type] = {GoKind.STRING: str, GoKind.BOOL: bool}


@attrs.define(eq=False)
class GoType:
    """A Go type as far as decoding can fail on it. Struct fields may be added after
    creation, for the recursive types (ToolProperty holds ToolProperty)."""

    kind: GoKind
    name: str = ""
    elem: GoType | None = None
    fields: dict[str, GoType] = attrs.field(factory=dict)
    folded: dict[str, str] = attrs.field(factory=dict)
    accepts: Callable[[object], bool] | None = None
    """For CUSTOM: whether its UnmarshalJSON takes this non-null value."""
    parts: tuple[GoType, ...] = ()
    """For CUSTOM: types its UnmarshalJSON decodes the value into, checked after `accepts`."""
    nullable: bool = False
    """A pointer, slice, map or interface: a JSON null sets it back to nil."""
    fresh: bool = False
    """For STRUCT: its UnmarshalJSON decodes into a new value and replaces the old one
    (api.Message), so a duplicate does not merge into what an earlier member left."""
    decoder: Callable[[object, object], object] | None = None
    """For CUSTOM: what it holds after its UnmarshalJSON took a value, given what it held
    (govalues.decode); without one the value is replaced."""
    plain: dict[str, type] = attrs.field(factory=dict)
    """For STRUCT: the Python type that fills each string or bool field written under its
    own name (`str`, `bool`): a member of that type needs no other look (`check`)."""

    def field(self, name: str, kind: GoType) -> None:
        self.fields[name] = kind
        self.folded[fold_key(name)] = name
        if kind.kind in _PLAIN_TYPES:
            self.plain[name] = _PLAIN_TYPES[kind.kind]
        else:
            self.plain.pop(name, None)

    def lookup(self, key: str) -> GoType | None:
        """The field Go decodes a member with this key into (exact name, else folded)."""
        found = self.fields.get(key)
        if found is not None:
            return found
        name = self.folded.get(fold_key(key))
        return None if name is None else self.fields[name]


def struct(name: str, /, **fields: GoType) -> GoType:
    made = GoType(GoKind.STRUCT, name)
    for field, kind in fields.items():
        made.field(field, kind)
    return made


def slice_of(elem: GoType) -> GoType:
    return GoType(GoKind.SLICE, f"[]{elem.name}", elem, nullable=True)


def map_of(elem: GoType) -> GoType:
    return GoType(GoKind.MAP, f"map[string]{elem.name}", elem, nullable=True)


def pointer(kind: GoType) -> GoType:
    """*T: decoded as T, and a null sets it back to nil."""
    return attrs.evolve(kind, name=f"*{kind.name}", nullable=True)


STRING = GoType(GoKind.STRING, "string")
BOOL = GoType(GoKind.BOOL, "bool")
INT = GoType(GoKind.INT, "int")
INT32 = GoType(GoKind.INT32, "int32")
UINT8 = GoType(GoKind.UINT8, "uint8")
FLOAT64 = GoType(GoKind.FLOAT64, "float64")
FLOAT32 = GoType(GoKind.FLOAT32, "float32")
ANY = GoType(GoKind.ANY, "interface {}", nullable=True)
RAW = GoType(GoKind.RAW, "json.RawMessage", nullable=True)
BYTES = GoType(GoKind.BYTES, "[]uint8", nullable=True)


def is_base64(text: str) -> bool:
    """Whether Go's base64.StdEncoding decodes it (it skips CR and LF anywhere)."""
    return _BASE64.fullmatch(text.replace("\r", "").replace("\n", "")) is not None


def _scalar_fits(value: object, kind: GoKind) -> bool:
    cls = type(value)
    if kind is GoKind.STRING:
        return cls is str
    if kind is GoKind.BOOL:
        return cls is bool
    if kind is GoKind.INT:
        # An integer literal only (Go's ParseInt refuses "1.0" and "1e2"); a float here
        # came from a fraction, an exponent or a literal too long to be an int64.
        return cls is int and -_INT64 <= value < _INT64
    if kind is GoKind.INT32:
        return cls is int and -_INT32 <= value < _INT32
    if kind is GoKind.UINT8:
        return cls is int and 0 <= value < 256
    if kind is GoKind.FLOAT64:
        return (cls is int) or (cls is float and math.isfinite(value))
    if kind is GoKind.FLOAT32:
        return (cls is int or cls is float) and abs(value) < _FLOAT32_OVERFLOW
    raise AssertionError(kind)


def check(value: object, kind: GoType) -> None:
    """Raise GoJsonError where Go's decoder fails to fill `kind` from `value`."""
    stack: list[tuple[object, GoType]] = [(value, kind)]
    pop, push = stack.pop, stack.append
    while stack:
        value, kind = pop()
        if value is None:
            # A pointer, slice, map or interface becomes nil, anything else is left as it
            # was, and every UnmarshalJSON the requests reach takes null.
            continue
        k = kind.kind
        if k is GoKind.RAW:
            continue
        if k is GoKind.ANY:
            _check_any(value)
            continue
        cls = type(value)
        if k is GoKind.STRUCT:
            _check_members(value, kind, push)
        elif k is GoKind.SLICE:
            if cls is not list:
                raise _mismatch(value, kind)
            elem = kind.elem
            if elem.kind is GoKind.STRUCT:
                # The common case (messages, tools): each element's plain fields are
                # checked here rather than one stack round trip per member.
                for item in value:
                    if item is not None:
                        _check_members(item, elem, push)
            else:
                for item in value:
                    push((item, elem))
        elif k is GoKind.MAP:
            if cls is not tuple:
                raise _mismatch(value, kind)
            elem = kind.elem
            if elem.kind is GoKind.ANY:
                # options: each value checked here, only containers walked
                for _key, member in value:
                    _check_any_member(member)
            else:
                for _key, member in value:
                    push((member, elem))
        elif k is GoKind.BYTES:
            if cls is str:
                if not is_base64(value):
                    raise GoJsonError("illegal base64 data")
            elif cls is list:
                for item in value:
                    push((item, UINT8))
            else:
                raise _mismatch(value, kind)
        elif k is GoKind.CUSTOM:
            if not kind.accepts(value):
                raise GoJsonError(f"cannot unmarshal into {kind.name}")
            for part in kind.parts:
                push((value, part))
        elif not _scalar_fits(value, k):
            raise _mismatch(value, kind)


def _check_members(value: object, kind: GoType, push: Callable) -> None:
    """A struct's members: string and bool fields checked at once, the others pushed."""
    if type(value) is not tuple:
        raise _mismatch(value, kind)
    fields = kind.fields
    plain = kind.plain.get
    for key, member in value:
        if type(member) is plain(key):
            continue  # a string or bool field, under its own name, given one
        field = fields.get(key)
        if field is None:
            field = kind.lookup(key)
            if field is None:
                continue
        if member is None:
            continue
        k = field.kind
        if k is GoKind.STRING:
            if type(member) is not str:
                raise _mismatch(member, field)
        elif k is GoKind.BOOL:
            if type(member) is not bool:
                raise _mismatch(member, field)
        elif k is GoKind.ANY:
            _check_any_member(member)
        else:
            push((member, field))


def _check_any(value: object) -> None:
    """interface{}: every number must fit a float64."""
    stack = [value]
    while stack:
        value = stack.pop()
        cls = type(value)
        if cls is float:
            if not math.isfinite(value):
                raise GoJsonError("cannot unmarshal number into Go value of type float64")
        elif cls is list:
            stack.extend(value)
        elif cls is tuple:
            stack.extend(member for _key, member in value)


def _check_any_member(value: object) -> None:
    """`_check_any` without its stack for the scalars most members are."""
    cls = type(value)
    if cls is str or cls is int or cls is bool:
        return
    if cls is float:
        if not math.isfinite(value):
            raise GoJsonError("cannot unmarshal number into Go value of type float64")
        return
    _check_any(value)


def fits_any(value: object) -> bool:
    try:
        _check_any(value)
    except GoJsonError:
        return False
    return True


def _mismatch(value: object, kind: GoType) -> GoJsonError:
    return GoJsonError(f"cannot unmarshal {_json_kind(value)} into Go value of type {kind.name}")


def _json_kind(value: object) -> str:
    cls = type(value)
    if cls is bool:
        return "bool"
    if cls is str:
        return "string"
    if cls is list:
        return "array"
    if cls is tuple:
        return "object"
    return "number"
