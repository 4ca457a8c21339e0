"""Request bodies read the way gin's ShouldBindJSON reads them, with Go's error texts.

gin decodes the body with one `json.Decoder.Decode`: an empty body is io.EOF (Ollama
answers "missing request body"), bytes after the first JSON value are ignored, a syntax
error is `invalid character ...`, and a field of the wrong JSON type is
`json: cannot unmarshal <kind> into Go struct field <Struct>.<field> of type <type>`.
"""

from __future__ import annotations

import enum
import json

import attrs


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


@attrs.frozen
class Struct:
    """A Go request struct: its name in error messages and the fields we check."""

    name: str
    fields: dict[str, GoType]


def _json_kind(value: object) -> str:
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
        return isinstance(value, int) and not isinstance(value, bool)
    if kind is GoType.FLOAT:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if kind in (GoType.OPTIONS, GoType.STREAM_OPTIONS):
        return isinstance(value, dict)
    if kind in (GoType.MESSAGES, GoType.OPENAI_MESSAGES):
        return isinstance(value, list) and all(isinstance(m, dict | None) for m in value)
    if kind is GoType.STRINGS:
        return isinstance(value, list) and all(isinstance(v, str | None) for v in value)
    if kind is GoType.INTS:
        return isinstance(value, list) and all(
            isinstance(v, int) and not isinstance(v, bool) for v in value
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


def _reject_constant(name: str) -> object:
    # Go's decoder has no NaN or Infinity literals.
    raise json.JSONDecodeError("Expecting value", name, 0)


def _finite_float(text: str) -> float:
    value = float(text)
    if value in (float("inf"), float("-inf")):
        raise BindError(f"json: cannot unmarshal number {text} into Go value of type float64")
    return value


def decode(body: bytes) -> object:
    """The first JSON value in the body (the rest is ignored, as json.Decoder does)."""
    text = body.decode("utf-8", errors="replace")
    start = len(text) - len(text.lstrip())
    if start == len(text):
        raise EmptyBody()
    decoder = json.JSONDecoder(parse_constant=_reject_constant, parse_float=_finite_float)
    try:
        value, _ = decoder.raw_decode(text, start)
    except json.JSONDecodeError as err:
        if err.doc in ("NaN", "Infinity", "-Infinity"):
            index = text.find(err.doc, start)
            raise BindError(
                f"invalid character {_quote_char(text[index])} looking for beginning of value"
            ) from None
        raise BindError(_syntax_message(text, err)) from None
    return value


def bind(body: bytes, struct: Struct) -> dict[str, object]:
    """Decode a request body into a JSON object whose checked fields have their Go types."""
    value = decode(body)
    if not isinstance(value, dict):
        raise BindError(
            f"json: cannot unmarshal {_json_kind(value)} into Go value of type {struct.name}"
        )
    for key, kind in struct.fields.items():
        if key in value and not _fits(value[key], kind):
            short = struct.name.rsplit(".", 1)[-1]
            raise BindError(
                f"json: cannot unmarshal {_json_kind(value[key])} into Go struct field "
                f"{short}.{key} of type {kind.value}"
            )
    return value


def text_field(body: dict[str, object], key: str) -> str:
    """A string field after binding (absent and null are "")."""
    value = body.get(key)
    return value if isinstance(value, str) else ""
