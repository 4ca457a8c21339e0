"""Request bodies read the way gin's ShouldBindJSON reads them, with Go's error texts.

gin decodes the body with one `json.Decoder.Decode`: an empty body is io.EOF (Ollama
answers "missing request body"), bytes after the first JSON value are ignored, a syntax
error is `invalid character ...`, and a field of the wrong JSON type is
`json: cannot unmarshal <kind> into Go struct field <Struct>.<field> of type <type>`.

Object keys find struct fields as Go's decoder finds them: an exact match, else a
case-insensitive one (fold.go); every duplicate is decoded and the last one wins, and a
second object for a map field is decoded into the map the first one made. Strings keep
invalid UTF-8 and lone surrogate escapes as U+FFFD. A number beyond float64 is an error
only where it is decoded into a number (an unknown field is skipped unread).
"""

from __future__ import annotations

import enum
import json
import math
import re

import attrs

from gpugate.sim.ollama.jsonscan import TooDeep, scan
from gpugate.sim.ollama.messages import API_MESSAGE, OPENAI_MESSAGE, Found, check_messages


class BindError(ValueError):
    """The body could not be decoded; the message is Go's."""


class EmptyBody(BindError):
    """io.EOF: nothing but whitespace was sent."""

    def __init__(self) -> None:
        super().__init__("EOF")


class GoType(enum.Enum):
    """The Go type of a request struct field, as Go's error messages name it."""

    STRING = "string"
    BOOL = "bool"
    INT = "int"
    FLOAT = "float64"
    OPTIONS = "map[string]interface {}"
    ANY = "interface {}"
    MESSAGES = "[]api.Message"
    OPENAI_MESSAGES = "[]openai.Message"
    STRINGS = "[]string"
    INTS = "[]int"
    STREAM_OPTIONS = "openai.StreamOptions"
    DURATION = "api.Duration"


_NUMERIC = (GoType.INT, GoType.FLOAT, GoType.OPTIONS, GoType.ANY, GoType.DURATION)
"""Fields whose numbers Go converts (to int, float64 or interface{}) as it decodes them."""
_MESSAGE_FIELDS = ("role", "content", "images", "tool_calls", "thinking")
_SURROGATES = re.compile("[\ud800-\udfff]")
_FOLDS = str.maketrans({"\u212a": "K", "\u017f": "S"})


class _Pairs(list[tuple[str, object]]):
    """A JSON object as its members in order, duplicates included."""


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


def _fold(key: str) -> str:
    """Go's foldName for keys that can match an ASCII field name."""
    return key.translate(_FOLDS).upper()


def _go_text(text: str) -> str:
    return text if text.isascii() else _SURROGATES.sub("\ufffd", text)


def _plain(value: object) -> object:
    """Decoded members as Go holds them in a map or interface{}: last duplicate wins.
    Without recursion: a value may nest 10000 deep."""
    root: list[object] = [value]
    stack: list[tuple[list | dict, int | str]] = [(root, 0)]
    while stack:
        holder, slot = stack.pop()
        item = holder[slot]
        if isinstance(item, _Pairs):
            made: dict[str, object] = {}
            for k, v in item:
                made[_go_text(k)] = v
            holder[slot] = made
            stack.extend((made, k) for k in made)
        elif isinstance(item, list):
            copied = list(item)
            holder[slot] = copied
            stack.extend((copied, i) for i in range(len(copied)))
        elif isinstance(item, str):
            holder[slot] = _go_text(item)
    return root[0]


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


def _fold_message(message: object) -> object:
    """An api.Message: its keys fold to its fields as the request's own keys do."""
    if not isinstance(message, dict):
        return message
    folded = {name.upper(): name for name in _MESSAGE_FIELDS}
    return {folded.get(_fold(k), k): v for k, v in message.items()}


@attrs.frozen
class Struct:
    """A Go request struct: its name in error messages and the fields we check."""

    name: str
    fields: dict[str, GoType]


def _json_kind(value: object) -> str:
    if isinstance(value, _Pairs | dict):
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


def _fits(value: object, kind: GoType) -> bool:
    if value is None or kind in (GoType.ANY, GoType.DURATION):
        return True
    if kind is GoType.STRING:
        return isinstance(value, str)
    if kind is GoType.BOOL:
        return isinstance(value, bool)
    if kind is GoType.INT:
        return isinstance(value, int | _BigNumber) and not isinstance(value, bool)
    if kind is GoType.FLOAT:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if kind in (GoType.OPTIONS, GoType.STREAM_OPTIONS):
        return isinstance(value, dict)
    if kind in (GoType.MESSAGES, GoType.OPENAI_MESSAGES):
        return isinstance(value, list)  # the elements are messages.py's
    if kind is GoType.STRINGS:
        return isinstance(value, list) and all(isinstance(v, str | None) for v in value)
    if kind is GoType.INTS:
        return isinstance(value, list) and all(
            isinstance(v, int | None) and not isinstance(v, bool) for v in value
        )
    return True


def _quote_char(char: str) -> str:
    if char == "'":
        return "'\\''"
    if char == '"':
        return "'\"'"
    return "'" + json.dumps(char)[1:-1] + "'"


def _open_container(text: str, pos: int) -> str:
    """The innermost bracket open at `pos` ('{', '[' or '')."""
    stack: list[str] = []
    in_string = escaped = False
    for char in text[:pos]:
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "{[":
            stack.append(char)
        elif char in "}]" and stack:
            stack.pop()
    return stack[-1] if stack else ""


def _syntax_message(text: str, err: json.JSONDecodeError) -> str:
    if err.pos >= len(text.rstrip()):
        return "unexpected EOF"
    char = _quote_char(text[err.pos])
    msg = err.msg
    if msg.startswith("Expecting property name"):
        return f"invalid character {char} looking for beginning of object key string"
    if msg.startswith("Expecting ':'"):
        return f"invalid character {char} after object key"
    if msg.startswith("Expecting ','"):
        where = (
            "object key:value pair" if _open_container(text, err.pos) == "{" else "array element"
        )
        return f"invalid character {char} after {where}"
    if msg.startswith("Expecting digit"):
        return f"invalid character {char} in numeric literal"
    if msg.startswith("Expecting decimal digit"):
        return f"invalid character {char} after decimal point in numeric literal"
    if msg.startswith("Expecting exponent digit"):
        return f"invalid character {char} in exponent of numeric literal"
    if msg.startswith(("Invalid control character", "Unterminated string")):
        return f"invalid character {char} in string literal"
    literal = _LITERALS.get(text[err.pos])
    if literal is not None:
        for offset, wanted in enumerate(literal[1:], 1):
            at = err.pos + offset
            if at >= len(text):
                return "unexpected EOF"
            if text[at] != wanted:
                got, expected = _quote_char(text[at]), _quote_char(wanted)
                return f"invalid character {got} in literal {literal} (expecting {expected})"
    return f"invalid character {char} looking for beginning of value"


_LITERALS = {"t": "true", "f": "false", "n": "null"}


def decode(body: bytes) -> object:
    """The first JSON value in the body (the rest is ignored, as json.Decoder does)."""
    # One U+FFFD per invalid byte, as Go's decoder replaces them.
    text = _go_text(body.decode("utf-8", errors="surrogateescape"))
    start = len(text) - len(text.lstrip(" \t\r\n"))
    if start == len(text):
        raise EmptyBody()
    try:
        value, _ = scan(text, start, pairs=_Pairs, number=_number, integer=_integer)
    except TooDeep as exc:
        raise BindError(str(exc)) from None
    except json.JSONDecodeError as err:
        raise BindError(_syntax_message(text, err)) from None
    return value


def bind(body: bytes, struct: Struct) -> dict[str, object]:
    """Decode a request body into a JSON object whose checked fields have their Go types."""
    value = decode(body)
    if value is None:
        return {}  # null leaves the struct as it was
    if not isinstance(value, _Pairs):
        raise BindError(
            f"json: cannot unmarshal {_json_kind(value)} into Go value of type {struct.name}"
        )
    short = struct.name.rsplit(".", 1)[-1]
    folded = {name.upper(): name for name in struct.fields}
    bound: dict[str, object] = {}
    saved: str | None = None  # Go keeps the first type error and decodes on
    for key, raw in value:
        key = _go_text(key)
        name = key if key in struct.fields else folded.get(_fold(key))
        item = _plain(raw)
        if name is None:
            # Go skips it unconverted; kept for the simulation's own `options` extension
            bound[key] = item
            continue
        kind = struct.fields[name]
        if not _fits(item, kind):
            saved = saved or (
                f"json: cannot unmarshal {_json_kind(raw)} into Go struct field "
                f"{short}.{name} of type {kind.value}"
            )
            continue
        big = _big_number(item) if kind in _NUMERIC else None
        if big is not None:
            target = "int" if kind is GoType.INT else "float64"
            message = (
                f"json: cannot unmarshal number {big.text} into Go struct field "
                f"{short}.{name} of type {target}"
            )
            if kind is GoType.DURATION:
                # api.Duration's own json.Unmarshal failed with a type error: the outer
                # decoder returns it at once, with the field's context added.
                raise BindError(message)
            saved = saved or message
            continue
        if kind in (GoType.MESSAGES, GoType.OPENAI_MESSAGES) and isinstance(raw, list):
            shape = API_MESSAGE if kind is GoType.MESSAGES else OPENAI_MESSAGE
            try:
                found = check_messages(raw, shape, short, _Pairs)
            except Found as exc:
                raise BindError(str(exc)) from None
            if found is not None:
                saved = saved or found
                continue
        if kind is GoType.OPTIONS and isinstance(item, dict):
            previous = bound.get(name)
            item = {**previous, **item} if isinstance(previous, dict) else item
        if kind in (GoType.MESSAGES, GoType.OPENAI_MESSAGES) and isinstance(item, list):
            item = [_fold_message(m) for m in item]
        bound[name] = item
    if saved is not None:
        raise BindError(saved)
    return bound


def text_field(body: dict[str, object], key: str) -> str:
    """A string field after binding (absent and null are "")."""
    value = body.get(key)
    return value if isinstance(value, str) else ""
