"""Request bodies read the way gin's ShouldBindJSON reads them into Ollama's request
structs, with Go's error texts.

gin decodes the body with one `json.Decoder.Decode` of Go 1.26's encoding/json (the v1
decoder, decode.go): an empty body is io.EOF (Ollama answers "missing request body"), bytes
after the first JSON value are ignored, a syntax error is `invalid character ...`, and a
field of the wrong JSON type is `json: cannot unmarshal <kind> into Go struct field
<Struct>.<field> of type <type>` (the first one is kept and decoding goes on).

Members are decoded in order, each into the field its key finds (exactly, else folded as
gofold.go_fold says), so the last duplicate wins:

* `null` sets a pointer, slice, map or interface field back to nil and leaves any other
  field as it was (decode.go literalStore): `{"model":"m","model":null}` names model "m";
* a second object for a map field is decoded into the map the first one made;
* a field whose type has its own UnmarshalJSON (api.Duration, api.ThinkValue) is decoded
  as its member is reached, and its error ends decoding there; json.RawMessage keeps the
  member's bytes (`null` too).

Strings keep invalid UTF-8 and lone surrogate escapes as U+FFFD. A number beyond float64
is an error only where it is decoded into a number (an unknown field is skipped unread).
"""

from __future__ import annotations

import base64
import binascii
import enum
import json
import math
import re

import attrs

from gpugate.sim.ollama.duration import DurationError, decode_keep_alive
from gpugate.sim.ollama.gofold import go_fold
from gpugate.sim.ollama.govalue import Pairs, Spec, decode_into, go_text, plain
from gpugate.sim.ollama.jsonscan import TooDeep, scan, syntax_message
from gpugate.sim.ollama.messages import (
    API_MESSAGE,
    API_TOOL,
    OPENAI_MESSAGE,
    REASONING,
    RESPONSE_FORMAT,
    STREAM_OPTIONS,
    Found,
    Leaf,
    Shape,
    check_fields,
    check_messages,
)


class BindError(ValueError):
    """The body could not be decoded; the message is Go's."""


class EmptyBody(BindError):
    """io.EOF: nothing but whitespace was sent."""

    def __init__(self) -> None:
        super().__init__("EOF")


class GoType(enum.Enum):
    """A request field's Go type: its name in Go's errors, and whether it is a pointer,
    slice, map or interface (null sets it to nil) or a value (null leaves it)."""

    STRING = ("string", False)
    STRING_POINTER = ("string", True)
    BOOL = ("bool", False)
    BOOL_POINTER = ("bool", True)
    INT = ("int", False)
    INT_POINTER = ("int", True)
    INT32 = ("int32", False)
    FLOAT = ("float64", False)
    FLOAT_POINTER = ("float64", True)
    FLOAT32 = ("float32", False)
    FLOAT32_POINTER = ("float32", True)
    OPTIONS = ("map[string]interface {}", True)
    ANY = ("interface {}", True)
    MESSAGES = ("[]api.Message", True)
    OPENAI_MESSAGES = ("[]openai.Message", True)
    STRINGS = ("[]string", True)
    INTS = ("[]int", True)
    IMAGES = ("[]api.ImageData", True)
    TOOLS = ("api.Tools", True)
    STREAM_OPTIONS = ("openai.StreamOptions", True)
    REASONING = ("openai.Reasoning", True)
    RESPONSE_FORMAT = ("openai.ResponseFormat", True)
    DURATION = ("api.Duration", True)
    """*api.Duration: its UnmarshalJSON; bound as nanoseconds."""
    THINK = ("api.ThinkValue", True)
    """*api.ThinkValue: its UnmarshalJSON; bound as True, False or a level string."""
    RAW = ("json.RawMessage", False)
    """Its UnmarshalJSON keeps the member's text, `null` included; bound as that text."""

    @property
    def go_name(self) -> str:
        return self.value[0]

    @property
    def nullable(self) -> bool:
        return self.value[1]


_NUMERIC = (GoType.INT, GoType.INT_POINTER, GoType.INT32, GoType.FLOAT, GoType.FLOAT_POINTER)
_NUMERIC += (GoType.FLOAT32, GoType.FLOAT32_POINTER, GoType.OPTIONS, GoType.ANY)
"""Fields whose numbers Go converts (to an int, a float or interface{}) as it decodes them."""
_SHAPES: dict[GoType, tuple[Shape, str]] = {
    GoType.TOOLS: (API_TOOL, "api.Tools"),
    GoType.STREAM_OPTIONS: (STREAM_OPTIONS, ""),
    GoType.REASONING: (REASONING, ""),
    GoType.RESPONSE_FORMAT: (RESPONSE_FORMAT, ""),
}
_VALUES: dict[GoType, Spec] = {
    GoType.MESSAGES: ("[]api.Message", API_MESSAGE),
    GoType.OPENAI_MESSAGES: ("[]openai.Message", OPENAI_MESSAGE),
    GoType.TOOLS: ("api.Tools", API_TOOL),
    GoType.STREAM_OPTIONS: STREAM_OPTIONS,
    GoType.REASONING: REASONING,
    GoType.RESPONSE_FORMAT: RESPONSE_FORMAT,
    GoType.STRINGS: ("[]string", Leaf.STRING),
    GoType.INTS: ("[]int", Leaf.INT),
    GoType.IMAGES: ("[]api.ImageData", Leaf.IMAGE),
}
"""Fields whose value a duplicate member decodes into (govalue.decode_into), not over."""
_THINK_LEVELS = ("high", "medium", "low", "max")
_SURROGATES = re.compile("[\ud800-\udfff]")
_INT_RANGE = {GoType.INT: 63, GoType.INT_POINTER: 63, GoType.INT32: 31}
_FLOAT32_MAX = 3.4028235677973366e38


class _BigNumber(float):
    """A number literal that does not fit a float64 (Go's strconv.ParseFloat fails)."""

    text: str


def _number(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        big = _BigNumber(value)
        big.text = text
        return big
    return value


def _integer(text: str) -> int | float:
    return int(text) if len(text) <= 40 else _number(text)


def _big_number(value: object) -> _BigNumber | None:
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, _BigNumber):
            return item
        if isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return None


@attrs.frozen
class Struct:
    """A Go request struct: its name in error messages and every field Go decodes."""

    name: str
    fields: dict[str, GoType]
    folded: dict[str, str] = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        # typeFields: the first field of each folded name keeps it
        folded: dict[str, str] = {}
        for name in self.fields:
            folded.setdefault(go_fold(name), name)
        object.__setattr__(self, "folded", folded)

    def field_for(self, key: str) -> str | None:
        """decode.go object(): the field by the exact key, else by its folded name."""
        return key if key in self.fields else self.folded.get(go_fold(key))


def _json_kind(value: object) -> str:
    if isinstance(value, Pairs | dict):
        return "object"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"


def _base64(text: str) -> bool:
    try:
        base64.b64decode(text.replace("\r", "").replace("\n", ""), validate=True)
    except (binascii.Error, ValueError):
        return False
    return True


def _image(value: object) -> bool:
    """api.ImageData ([]byte): a base64 string, or an array of bytes."""
    if value is None:
        return True
    if isinstance(value, str):
        return _base64(value)
    return isinstance(value, list) and all(
        v is None or (type(v) is int and 0 <= v <= 255) for v in value
    )


def _fits(value: object, kind: GoType) -> bool:
    if value is None or kind is GoType.ANY:
        return True
    if kind in (GoType.STRING, GoType.STRING_POINTER):
        return isinstance(value, str)
    if kind in (GoType.BOOL, GoType.BOOL_POINTER):
        return isinstance(value, bool)
    if kind in _INT_RANGE:
        bits = _INT_RANGE[kind]
        return type(value) is int and -(1 << bits) <= value < (1 << bits)
    if kind in (GoType.FLOAT32, GoType.FLOAT32_POINTER):
        return type(value) in (int, float) and abs(value) <= _FLOAT32_MAX
    if kind in (GoType.FLOAT, GoType.FLOAT_POINTER):
        return isinstance(value, int | float) and not isinstance(value, bool)
    if kind is GoType.OPTIONS:
        return isinstance(value, dict)
    if kind in (GoType.MESSAGES, GoType.OPENAI_MESSAGES):
        return isinstance(value, list)  # the elements are messages.py's
    if kind is GoType.STRINGS:
        return isinstance(value, list) and all(isinstance(v, str | None) for v in value)
    if kind is GoType.INTS:
        return isinstance(value, list) and all(
            v is None or (type(v) is int and -(1 << 63) <= v < (1 << 63)) for v in value
        )
    if kind is GoType.IMAGES:
        return isinstance(value, list) and all(_image(v) for v in value)
    return True  # the struct types are checked by messages.py's walk


def _think(value: object) -> bool | str:
    """api.ThinkValue.UnmarshalJSON (api/types.go): a bool, or one of the level strings."""
    if isinstance(value, bool):
        return value
    if isinstance(value, str):
        if value not in _THINK_LEVELS:
            raise BindError(
                f"invalid think value: {json.dumps(value)} "
                '(must be "high", "medium", "low", "max", true, or false)'
            )
        return value
    raise BindError(
        'think must be a boolean or string ("high", "medium", "low", "max", true, or false)'
    )


def decode(body: bytes, *, whole: bool = False) -> object:
    """The first JSON value in the body (the rest is ignored, as json.Decoder does); with
    `whole`, as json.Unmarshal reads it: anything but whitespace after it is an error."""
    # One U+FFFD per invalid byte, as Go's decoder replaces them.
    text = go_text(body.decode("utf-8", errors="surrogateescape"))
    start = len(text) - len(text.lstrip(" \t\r\n"))
    if start == len(text):
        raise EmptyBody()
    spans: list[tuple[int, int]] = []
    try:
        value, end = scan(text, start, pairs=Pairs, number=_number, integer=_integer, spans=spans)
    except TooDeep as exc:
        raise BindError(str(exc)) from None
    except json.JSONDecodeError as err:
        raise BindError(syntax_message(text, err)) from None
    if whole and text[end:].strip(" \t\r\n"):
        raise BindError("invalid character after top-level value")
    if isinstance(value, Pairs):
        value.text = text
        value.spans = spans
    return value


def exact_member(body: bytes, key: str) -> object:
    """json.Unmarshal of the whole body into map[string]json.RawMessage, then the member
    named exactly `key` (the last of them), as plain values; None when the body does not
    unmarshal or has no such member."""
    try:
        value = decode(body, whole=True)
    except BindError:
        return None
    if not isinstance(value, Pairs):
        return None
    found = None
    for name, member in value:
        if go_text(name) == key:
            found = member
    return plain(found)


def bind(body: bytes, struct: Struct) -> dict[str, object]:
    """Decode a request body into a JSON object whose fields have their Go types' values.

    A field absent from the result was never set (or its member was null and left it);
    None is a pointer, slice, map or interface set to nil.
    """
    value = decode(body)
    if value is None:
        return {}  # null leaves the struct as it was
    if not isinstance(value, Pairs):
        raise BindError(
            f"json: cannot unmarshal {_json_kind(value)} into Go value of type {struct.name}"
        )
    short = struct.name.rsplit(".", 1)[-1]
    bound: dict[str, object] = {}
    saved: str | None = None  # Go keeps the first type error and decodes on
    for index, (key, raw) in enumerate(value):
        key = go_text(key)
        name = struct.field_for(key)
        if name is None:
            # Go skips it unread; kept for the simulation's own `options` extension
            bound[key] = plain(raw)
            continue
        kind = struct.fields[name]
        if kind is GoType.RAW:
            bound[name] = value.raw(index)
            continue
        if raw is None:
            if kind.nullable:
                bound[name] = None
            continue
        item = plain(raw)
        if kind is GoType.DURATION:
            bound[name] = _duration(item, short, name)
            continue
        if kind is GoType.THINK:
            bound[name] = _think(item)
            continue
        error = _field_error(raw, item, kind, short, name)
        if error is not None:
            saved = saved or error
            continue
        if kind is GoType.OPTIONS and isinstance(item, dict):
            previous = bound.get(name)
            item = {**previous, **item} if isinstance(previous, dict) else item
        elif kind in _VALUES:
            item = decode_into(bound.get(name), raw, _VALUES[kind])
        bound[name] = item
    if saved is not None:
        raise BindError(saved)
    return bound


def _duration(item: object, short: str, name: str) -> int:
    """api.Duration.UnmarshalJSON, whose error ends decoding at once."""
    big = _big_number(item)
    if big is not None:
        # its own json.Unmarshal fails with a type error, which the outer decoder
        # returns with the field's context (decode.go addErrorContext)
        raise BindError(
            f"json: cannot unmarshal number {big.text} into Go struct field "
            f"{short}.{name} of type float64"
        )
    try:
        return decode_keep_alive(item)
    except DurationError as exc:
        raise BindError(str(exc)) from None


def _field_error(raw: object, item: object, kind: GoType, short: str, name: str) -> str | None:
    """The error Go saves for this member, if any; raises Found where decoding stops."""
    if not _fits(item, kind):
        return (
            f"json: cannot unmarshal {_json_kind(raw)} into Go struct field "
            f"{short}.{name} of type {kind.go_name}"
        )
    big = _big_number(item) if kind in _NUMERIC else None
    if big is not None:
        target = "float64" if kind in (GoType.OPTIONS, GoType.ANY) else kind.go_name
        return (
            f"json: cannot unmarshal number {big.text} into Go struct field "
            f"{short}.{name} of type {target}"
        )
    if kind in (GoType.MESSAGES, GoType.OPENAI_MESSAGES) and isinstance(raw, list):
        shape = API_MESSAGE if kind is GoType.MESSAGES else OPENAI_MESSAGE
        try:
            return check_messages(raw, shape, short, Pairs)
        except Found as exc:
            raise BindError(str(exc)) from None
    if kind in _SHAPES:
        shape, slice_of = _SHAPES[kind]
        return check_fields(raw, shape, short, name, Pairs, slice_of=slice_of)
    return None


def text_field(body: dict[str, object], key: str) -> str:
    """A string field after binding (absent and null are "")."""
    value = body.get(key)
    return value if isinstance(value, str) else ""
