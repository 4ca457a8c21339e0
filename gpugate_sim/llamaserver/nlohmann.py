"""`json::parse` as llama-server does it: nlohmann json 3.12's lexer and SAX parser.

llama-server parses every request body with `json::parse(req.body)` (common/json.cpp wraps
`ordered_json::parse`), and a body that is not JSON answers 500 with the exception's
`what()`. `parse` gives the value, or that message, byte for byte as nlohmann words it
(vendor/nlohmann/json.hpp):

* `lexer::scan`: a UTF-8 BOM is skipped, whitespace is space, tab, LF and CR, and a NUL
  byte outside a string is the end of input (so anything after it is never read);
* the position (`position_t`) counts every `get()`, the end of input included: the column
  is the bytes read on the current line, an LF starts a new line at column 0, and an
  `unget()` of the byte after a number steps back (after an LF: to column 0 of the line
  before, not the column it came from);
* "last read" (`get_token_string`) is every byte read since the last string or number
  token began (structural characters and literals do not reset it), control characters
  as `<U+XXXX>`;
* `parser::sax_parse_internal` and `exception_message` name the context ("value", "object
  key", "object separator", "object", "array") and, for a lexer error, its message and
  what was last read, else the unexpected token; then the expected token, if any;
* a float that overflows is `out_of_range.406`; integers beyond 64 bits are floats.

The message then goes out through `dump_safe` (invalid UTF-8 replaced by U+FFFD).
A valid body takes a fast path (Python's json, where it reads as nlohmann does); anything
else through the parser here over nlohmann_lexer.py's lexer.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

import attrs

from gpugate_sim.llamaserver.nlohmann_lexer import (
    BEGIN_ARRAY,
    BEGIN_OBJECT,
    END_ARRAY,
    END_OBJECT,
    END_OF_INPUT,
    INT_MIN,
    LITERAL_FALSE,
    LITERAL_NULL,
    LITERAL_OR_VALUE,
    LITERAL_TRUE,
    NAME_SEPARATOR,
    PARSE_ERROR,
    TOKEN_NAMES,
    UINT_MAX,
    UNINITIALIZED,
    VALUE_FLOAT,
    VALUE_INTEGER,
    VALUE_SEPARATOR,
    VALUE_STRING,
    VALUE_UNSIGNED,
    Lexer,
)  # fmt: skip


@attrs.frozen
class JsonError:
    """What `json::parse` threw: the exception's `what()`."""

    message: str


class _Failed(Exception):
    def __init__(self, message: bytes) -> None:
        self.message = message


class _Parser:
    """`parser::parse(strict=true)` with the DOM SAX handler."""

    def __init__(self, data: bytes) -> None:
        self.lexer = Lexer(data)
        self.last = UNINITIALIZED
        self.next_token()

    def next_token(self) -> int:
        self.last = self.lexer.scan()
        return self.last

    def fail(self, expected: int, context: str) -> _Failed:
        """`parse_error::create(101, position, exception_message(expected, context))`."""
        lexer = self.lexer
        message = f"syntax error while parsing {context} - ".encode()
        if self.last == PARSE_ERROR:
            message += lexer.error.encode() + b"; last read: '" + lexer.token_text() + b"'"
        else:
            message += f"unexpected {TOKEN_NAMES[self.last]}".encode()
        if expected != UNINITIALIZED:
            message += f"; expected {TOKEN_NAMES[expected]}".encode()
        return self.failure(message)

    def failure(self, what: bytes) -> _Failed:
        head = f"[json.exception.parse_error.101] parse error at {self.lexer.position()}: "
        return _Failed(head.encode() + what)

    def parse(self) -> Any:
        value = self._value()
        if self.next_token() != END_OF_INPUT:
            raise self.fail(END_OF_INPUT, "value")
        return value

    def _value(self) -> Any:
        """`sax_parse_internal`, with a stack of open containers (and their keys)."""
        lexer = self.lexer
        stack: list[tuple[Any, str | None]] = []
        root: Any = None
        while True:
            token = self.last
            value: Any
            opened = False
            if token == BEGIN_OBJECT:
                value, opened = {}, True
            elif token == BEGIN_ARRAY:
                value, opened = [], True
            elif token == VALUE_FLOAT:
                if not math.isfinite(lexer.number):
                    raise _Failed(b"[json.exception.out_of_range.406] number overflow parsing '"
                                  + lexer.token_text() + b"'")  # fmt: skip
                value = lexer.number
            elif token in (VALUE_UNSIGNED, VALUE_INTEGER):
                value = lexer.number
            elif token == VALUE_STRING:
                value = lexer.string_value()
            elif token in (LITERAL_TRUE, LITERAL_FALSE, LITERAL_NULL):
                value = {LITERAL_TRUE: True, LITERAL_FALSE: False, LITERAL_NULL: None}[token]
            elif token == PARSE_ERROR:
                raise self.fail(UNINITIALIZED, "value")
            elif token == END_OF_INPUT and lexer.total == 1:
                raise self.failure(
                    b"attempting to parse an empty input; check that your input string or "
                    b"stream contains the expected JSON"
                )
            else:
                raise self.fail(LITERAL_OR_VALUE, "value")
            # handle_value: into the open container, or the root
            if not stack:
                root = value
            elif isinstance(stack[-1][0], list):
                stack[-1][0].append(value)
            else:
                stack[-1][0][stack[-1][1]] = value
            if opened:
                if isinstance(value, dict):
                    if self.next_token() != END_OBJECT:
                        stack.append((value, self._key()))
                        self.next_token()
                        continue
                elif self.next_token() != END_ARRAY:
                    stack.append((value, None))
                    continue
            # a value is complete: close containers until one takes another value
            while stack:
                container, _ = stack[-1]
                if isinstance(container, list):
                    if self.next_token() == VALUE_SEPARATOR:
                        self.next_token()
                        break
                    if self.last != END_ARRAY:
                        raise self.fail(END_ARRAY, "array")
                else:
                    if self.next_token() == VALUE_SEPARATOR:
                        self.next_token()
                        stack[-1] = (container, self._key())
                        self.next_token()
                        break
                    if self.last != END_OBJECT:
                        raise self.fail(END_OBJECT, "object")
                stack.pop()
            else:
                return root

    def _key(self) -> str:
        """A key (the current token) and its `:`; the key is null until its value comes."""
        if self.last != VALUE_STRING:
            raise self.fail(VALUE_STRING, "object key")
        key = self.lexer.string_value()
        if self.next_token() != NAME_SEPARATOR:
            raise self.fail(NAME_SEPARATOR, "object separator")
        return key


def parse_exact(raw: bytes) -> Any | JsonError:
    """The body parsed by the lexer and parser above, or the exception's message."""
    try:
        return _Parser(raw).parse()
    except _Failed as exc:
        # safe_json_to_str (dump with error_handler_t::replace): bad UTF-8 becomes U+FFFD
        return JsonError(exc.message.decode("utf-8", errors="replace"))


def parse(raw: bytes) -> Any | JsonError:
    """`json::parse(raw)`: the value, or a JsonError with nlohmann's message.

    A body Python's json reads as nlohmann does is read by it: valid UTF-8 without a NUL
    or a BOM, no `\\uD800`..`\\uDFFF` escape (Python keeps a lone surrogate), no NaN or
    Infinity, no float that overflows; integers beyond 64 bits become floats."""
    if b"\x00" in raw or raw.startswith(b"\xef") or _SURROGATE_ESCAPE.search(raw):
        return parse_exact(raw)
    try:
        return json.loads(raw.decode("utf-8"), parse_constant=_refuse, parse_int=_integer,
                          parse_float=_float)  # fmt: skip
    except (UnicodeDecodeError, ValueError, RecursionError):
        return parse_exact(raw)


_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


def _refuse(name: str) -> Any:
    raise ValueError(name)  # NaN, Infinity, -Infinity: not JSON to nlohmann


def _integer(text: str) -> int | float:
    value = int(text)
    return value if INT_MIN <= value <= UINT_MAX else _float(text)


def _float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(text)  # out_of_range.406
    return value
