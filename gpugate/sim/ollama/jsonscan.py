"""The simulated Ollama's JSON reader: one value, without recursion, to Go's depth limit.

Python's json scanner recurses once per nesting level and gives up near a thousand; Go's
scanner takes 10000 levels and stops at the 10001st with "invalid character '[' exceeded
max depth" (scanner.go pushParseState: a syntax error at the bracket). Syntax
errors are raised as json.JSONDecodeError with the C scanner's messages and positions,
so binding.py words them as Go does whatever reader found them.
"""

from __future__ import annotations

import json
import json.decoder
import re
from collections.abc import Callable

MAX_DEPTH = 10000
"""encoding/json scanner.go maxNestingDepth."""

_WS = re.compile(r"[ \t\n\r]*")
_NUMBER = re.compile(r"(-?(?:0|[1-9][0-9]*))(\.[0-9]+)?([eE][-+]?[0-9]+)?")
_WORDS = (("null", None), ("true", True), ("false", False))


class TooDeep(ValueError):
    """Nesting past Go's limit."""


def scan(
    text: str,
    pos: int,
    *,
    pairs: Callable[[list], object],
    number: Callable[[str], object],
    integer: Callable[[str], object],
    spans: list[tuple[int, int]] | None = None,
) -> tuple[object, int]:
    """The JSON value at `pos` and the index after it. With `spans`, the text span of each
    member's value of a top-level object is appended to it, in order (a json.RawMessage
    field is those bytes)."""
    # Each frame: [items, "{" or "[", pending key]
    stack: list[list] = []
    start = pos
    while True:
        pos = _WS.match(text, pos).end()
        char = text[pos : pos + 1]
        if len(stack) == 1:
            start = pos
        if char in ("{", "["):
            if len(stack) >= MAX_DEPTH:
                raise TooDeep(f"invalid character '{char}' exceeded max depth")
            pos = _WS.match(text, pos + 1).end()
            closer = "}" if char == "{" else "]"
            if text.startswith(closer, pos):
                value: object = pairs([]) if char == "{" else []
                pos += 1
            else:
                stack.append([[], char, None])
                if char == "{":
                    pos = _key(text, pos, stack[-1])
                continue
        elif char == '"':
            value, pos = json.decoder.scanstring(text, pos + 1, True)
        else:
            value, pos = _literal(text, pos, number, integer)
        while True:
            if not stack:
                return value, pos
            frame = stack[-1]
            items, kind = frame[0], frame[1]
            items.append((frame[2], value) if kind == "{" else value)
            if spans is not None and len(stack) == 1 and kind == "{":
                spans.append((start, pos))
            pos = _WS.match(text, pos).end()
            if text.startswith(",", pos):
                pos = _WS.match(text, pos + 1).end()
                if kind == "{":
                    pos = _key(text, pos, frame)
                break
            if not text.startswith("}" if kind == "{" else "]", pos):
                raise json.JSONDecodeError("Expecting ',' delimiter", text, pos)
            stack.pop()
            value = pairs(items) if kind == "{" else items
            pos += 1


def _literal(
    text: str, pos: int, number: Callable[[str], object], integer: Callable[[str], object]
) -> tuple[object, int]:
    for word, literal in _WORDS:
        if text.startswith(word, pos):
            return literal, pos + len(word)
    match = _NUMBER.match(text, pos)
    if match is None:
        if text.startswith("-", pos):
            raise json.JSONDecodeError("Expecting digit", text, pos + 1)
        raise json.JSONDecodeError("Expecting value", text, pos)
    whole, frac, exp = match.groups()
    end = match.end()
    # Where Python's pattern stops short, Go's scanner is inside the number and says so.
    if not frac and text.startswith(".", end):
        raise json.JSONDecodeError("Expecting decimal digit", text, end + 1)
    if not exp and text[end : end + 1] in ("e", "E"):
        sign = 1 if text[end + 1 : end + 2] in ("+", "-") else 0
        raise json.JSONDecodeError("Expecting exponent digit", text, end + 1 + sign)
    value = number(match.group()) if frac or exp else integer(whole)
    return value, end


def _key(text: str, pos: int, frame: list) -> int:
    if not text.startswith('"', pos):
        raise json.JSONDecodeError("Expecting property name enclosed in double quotes", text, pos)
    key, pos = json.decoder.scanstring(text, pos + 1, True)
    pos = _WS.match(text, pos).end()
    if not text.startswith(":", pos):
        raise json.JSONDecodeError("Expecting ':' delimiter", text, pos)
    frame[2] = key
    return pos + 1


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


def syntax_message(text: str, err: json.JSONDecodeError) -> str:
    """Go's SyntaxError text for what the scanner stopped at."""
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
