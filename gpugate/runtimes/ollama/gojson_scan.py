"""A JSON value read without recursion, to Go's nesting limit.

Python's json scanner recurses once per nesting level and gives up near a thousand;
Go's decoder accepts 10000 levels and refuses the 10001st ("exceeded max depth"). A body
that may be deep is read here instead, with an explicit stack, into the same values the
C scanner gives (objects as tuples of `(key, value)` pairs, arrays as lists).
"""

from __future__ import annotations

import json.decoder
import re

MAX_DEPTH = 10000
"""encoding/json's maxNestingDepth."""

_WS = re.compile(r"[ \t\n\r]*")
_NUMBER = re.compile(r"(-?(?:0|[1-9][0-9]*))(\.[0-9]+)?([eE][-+]?[0-9]+)?")
_LITERALS = (("true", True), ("false", False), ("null", None))
_scanstring = json.decoder.scanstring


class ScanError(ValueError):
    """The text is not one JSON value Go accepts."""


def parse_int(text: str) -> int | float:
    """An integer literal: long ones go through float, as Go never holds them exactly."""
    return int(text) if len(text) <= 40 else float(text)


def _number(text: str, pos: int) -> tuple[object, int]:
    match = _NUMBER.match(text, pos)
    if match is None:
        raise ScanError(f"invalid character at offset {pos}")
    integer, frac, exp = match.groups()
    value = float(integer + (frac or "") + (exp or "")) if frac or exp else parse_int(integer)
    return value, match.end()


def _string(text: str, pos: int) -> tuple[str, int]:
    try:
        return _scanstring(text, pos + 1, True)
    except ValueError as exc:
        raise ScanError(str(exc)) from None


def scan(text: str, pos: int) -> tuple[object, int]:
    """The JSON value starting at `pos` (no leading whitespace) and the index after it."""
    # Each frame: [container, pending key or None]; a tuple-building object collects
    # pairs in a list until it closes.
    stack: list[list] = []
    while True:
        pos = _WS.match(text, pos).end()
        if pos >= len(text):
            raise ScanError("unexpected end of JSON input")
        char = text[pos]
        if char == "{" or char == "[":
            if len(stack) >= MAX_DEPTH:
                raise ScanError("exceeded max depth")
            stack.append([[], char, None])
            pos = _WS.match(text, pos + 1).end()
            closer = "}" if char == "{" else "]"
            if text.startswith(closer, pos):
                frame = stack.pop()
                value: object = tuple(frame[0]) if char == "{" else frame[0]
                pos += 1
            elif char == "{":
                pos = _key(text, pos, stack[-1])
                continue
            else:
                continue
        elif char == '"':
            value, pos = _string(text, pos)
        elif char == "-" or "0" <= char <= "9":
            value, pos = _number(text, pos)
        else:
            for word, literal in _LITERALS:
                if text.startswith(word, pos):
                    value, pos = literal, pos + len(word)
                    break
            else:
                raise ScanError(f"invalid character {char!r} looking for beginning of value")
        # A value is complete: hand it to the enclosing containers, closing as many as end.
        while True:
            if not stack:
                return value, pos
            frame = stack[-1]
            items, kind = frame[0], frame[1]
            items.append((frame[2], value) if kind == "{" else value)
            pos = _WS.match(text, pos).end()
            if text.startswith(",", pos):
                pos = _WS.match(text, pos + 1).end()
                if kind == "{":
                    pos = _key(text, pos, frame)
                break
            closer = "}" if kind == "{" else "]"
            if not text.startswith(closer, pos):
                where = "object key:value pair" if kind == "{" else "array element"
                raise ScanError(f"invalid character after {where}")
            stack.pop()
            value = tuple(items) if kind == "{" else items
            pos += 1


def _key(text: str, pos: int, frame: list) -> int:
    """Reads `"key" :` into the frame; the index of the value after it."""
    if not text.startswith('"', pos):
        raise ScanError("invalid character looking for beginning of object key string")
    key, pos = _string(text, pos)
    pos = _WS.match(text, pos).end()
    if not text.startswith(":", pos):
        raise ScanError("invalid character after object key")
    frame[2] = key
    return pos + 1
