"""nlohmann json 3.12's `lexer` (vendor/nlohmann/json.hpp) over a request body's bytes.

What the parser's error messages are made of, kept as nlohmann keeps it: the position
(`position_t`: every `get()` counts, the end of input included; an LF starts a new line at
column 0; an `unget()` steps back), the bytes read since the last string or number token
began (`token_string`), and the lexer's own error message. See nlohmann.py.
"""

from __future__ import annotations

import re

EOF = -1
# enum token_type (lexer_base)
(UNINITIALIZED, LITERAL_TRUE, LITERAL_FALSE, LITERAL_NULL, VALUE_STRING, VALUE_UNSIGNED,
 VALUE_INTEGER, VALUE_FLOAT, BEGIN_ARRAY, BEGIN_OBJECT, END_ARRAY, END_OBJECT, NAME_SEPARATOR,
 VALUE_SEPARATOR, PARSE_ERROR, END_OF_INPUT, LITERAL_OR_VALUE) = range(17)  # fmt: skip
TOKEN_NAMES = {
    UNINITIALIZED: "<uninitialized>", LITERAL_TRUE: "true literal",
    LITERAL_FALSE: "false literal", LITERAL_NULL: "null literal",
    VALUE_STRING: "string literal", VALUE_UNSIGNED: "number literal",
    VALUE_INTEGER: "number literal", VALUE_FLOAT: "number literal", BEGIN_ARRAY: "'['",
    BEGIN_OBJECT: "'{'", END_ARRAY: "']'", END_OBJECT: "'}'", NAME_SEPARATOR: "':'",
    VALUE_SEPARATOR: "','", PARSE_ERROR: "<parse error>", END_OF_INPUT: "end of input",
    LITERAL_OR_VALUE: "'[', '{', or a literal",
}  # fmt: skip
"""lexer_base::token_type_name"""
_STRUCTURAL = {
    ord("["): BEGIN_ARRAY, ord("]"): END_ARRAY, ord("{"): BEGIN_OBJECT, ord("}"): END_OBJECT,
    ord(":"): NAME_SEPARATOR, ord(","): VALUE_SEPARATOR,
}  # fmt: skip
_LITERALS = {ord("t"): (b"true", LITERAL_TRUE), ord("f"): (b"false", LITERAL_FALSE),
             ord("n"): (b"null", LITERAL_NULL)}  # fmt: skip
_ESCAPES = {ord('"'): 0x22, ord("\\"): 0x5C, ord("/"): 0x2F, ord("b"): 0x08, ord("f"): 0x0C,
            ord("n"): 0x0A, ord("r"): 0x0D, ord("t"): 0x09}  # fmt: skip
_CONTROL_NAMES = (
    "NUL", "SOH", "STX", "ETX", "EOT", "ENQ", "ACK", "BEL", "BS", "HT", "LF", "VT", "FF", "CR",
    "SO", "SI", "DLE", "DC1", "DC2", "DC3", "DC4", "NAK", "SYN", "ETB", "CAN", "EM", "SUB",
    "ESC", "FS", "GS", "RS", "US",
)  # fmt: skip
_NO_LOW_SURROGATE = "invalid string: surrogate U+D800..U+DBFF must be followed by U+DC00..U+DFFF"
_NO_HIGH_SURROGATE = "invalid string: surrogate U+DC00..U+DFFF must follow U+D800..U+DBFF"
_BAD_HEX = "invalid string: '\\u' must be followed by 4 hex digits"
_SHORT_ESCAPES = {0x08: "b", 0x09: "t", 0x0A: "n", 0x0C: "f", 0x0D: "r"}
_UTF8_RANGES: dict[int, tuple[tuple[int, int], ...]] = {}
"""scan_string: the continuation bytes each lead byte needs (Unicode table 3-7)."""
for _lead in range(0xC2, 0xE0):
    _UTF8_RANGES[_lead] = ((0x80, 0xBF),)
_UTF8_RANGES[0xE0] = ((0xA0, 0xBF), (0x80, 0xBF))
for _lead in (*range(0xE1, 0xED), 0xEE, 0xEF):
    _UTF8_RANGES[_lead] = ((0x80, 0xBF), (0x80, 0xBF))
_UTF8_RANGES[0xED] = ((0x80, 0x9F), (0x80, 0xBF))
_UTF8_RANGES[0xF0] = ((0x90, 0xBF), (0x80, 0xBF), (0x80, 0xBF))
for _lead in range(0xF1, 0xF4):
    _UTF8_RANGES[_lead] = ((0x80, 0xBF), (0x80, 0xBF), (0x80, 0xBF))
_UTF8_RANGES[0xF4] = ((0x80, 0x8F), (0x80, 0xBF), (0x80, 0xBF))
_PLAIN = re.compile(rb"[\x20\x21\x23-\x5b\x5d-\x7f]+")
"""Bytes a string copies as they are (a run of them is read at once)."""
_CONTROL = re.compile(rb"[\x00-\x1f]")
_DIGITS = frozenset(b"0123456789")
_NEED_DIGIT = {
    "minus": "invalid number; expected digit after '-'",
    "decimal1": "invalid number; expected digit after '.'",
    "sign": "invalid number; expected digit after exponent sign",
}
"""scan_number: the states that need a digit next, and the error without one."""
UINT_MAX = (1 << 64) - 1
INT_MIN = -(1 << 63)


def _control_message(byte: int) -> str:
    short = _SHORT_ESCAPES.get(byte)
    escape = f"\\u{byte:04X}" + (f" or \\{short}" if short else "")
    name = _CONTROL_NAMES[byte]
    return f"invalid string: control character U+{byte:04X} ({name}) must be escaped to {escape}"


class Lexer:
    """nlohmann's `lexer` over a byte string (`input_adapter` of a std::string)."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.index = 0
        self.current = EOF
        self.next_unget = False
        self.total = 0
        self.column = 0
        self.lines = 0
        self.token_string = bytearray()
        self.token_buffer = bytearray()
        self.error = ""
        self.number: int | float = 0

    # -- input management -------------------------------------------------------------------

    def get(self) -> int:
        self.total += 1
        self.column += 1
        if self.next_unget:
            self.next_unget = False
        elif self.index < len(self.data):
            self.current = self.data[self.index]
            self.index += 1
        else:
            self.current = EOF
        if self.current != EOF:
            self.token_string.append(self.current)
        if self.current == 0x0A:
            self.lines += 1
            self.column = 0
        return self.current

    def unget(self) -> None:
        self.next_unget = True
        self.total -= 1
        if self.column == 0:
            if self.lines > 0:
                self.lines -= 1
        else:
            self.column -= 1
        if self.current != EOF:
            self.token_string.pop()

    def reset(self) -> None:
        self.token_buffer.clear()
        self.token_string.clear()
        self.token_string.append(self.current & 0xFF)

    def token_text(self) -> bytes:
        """`get_token_string`: control characters as `<U+XXXX>`."""
        return _CONTROL.sub(lambda m: b"<U+%04X>" % m[0][0], bytes(self.token_string))

    def position(self) -> str:
        return f"line {self.lines + 1}, column {self.column}"

    # -- scanner ----------------------------------------------------------------------------

    def scan(self) -> int:
        if self.total == 0 and not self._skip_bom():
            self.error = "invalid BOM; must be 0xEF 0xBB 0xBF if given"
            return PARSE_ERROR
        while self.get() in (0x20, 0x09, 0x0A, 0x0D):
            pass
        c = self.current
        if c in _STRUCTURAL:
            return _STRUCTURAL[c]
        if c in _LITERALS:
            text, token = _LITERALS[c]
            for expected in text[1:]:
                if self.get() != expected:
                    self.error = "invalid literal"
                    return PARSE_ERROR
            return token
        if c == 0x22:
            return self._string()
        if c == 0x2D or c in _DIGITS:
            return self._number()
        if c in (0x00, EOF):
            return END_OF_INPUT
        self.error = "invalid literal"
        return PARSE_ERROR

    def _skip_bom(self) -> bool:
        if self.get() == 0xEF:
            return self.get() == 0xBB and self.get() == 0xBF
        self.unget()
        return True

    def _string(self) -> int:
        self.reset()
        add = self.token_buffer.append
        while True:
            if not self.next_unget:
                run = _PLAIN.match(self.data, self.index)
                if run is not None:
                    chunk = run.group()
                    self.index = run.end()
                    self.total += len(chunk)
                    self.column += len(chunk)
                    self.token_string += chunk
                    self.token_buffer += chunk
            c = self.get()
            if c == EOF:
                self.error = "invalid string: missing closing quote"
                return PARSE_ERROR
            if c == 0x22:
                return VALUE_STRING
            if c == 0x5C:
                if not self._escape():
                    return PARSE_ERROR
            elif c <= 0x1F:
                self.error = _control_message(c)
                return PARSE_ERROR
            elif c <= 0x7F:
                add(c)
            elif c in _UTF8_RANGES:
                add(c)
                for low, high in _UTF8_RANGES[c]:
                    if not low <= self.get() <= high:
                        self.error = "invalid string: ill-formed UTF-8 byte"
                        return PARSE_ERROR
                    add(self.current)
            else:
                self.error = "invalid string: ill-formed UTF-8 byte"
                return PARSE_ERROR

    def _escape(self) -> bool:
        c = self.get()
        if c in _ESCAPES:
            self.token_buffer.append(_ESCAPES[c])
            return True
        if c != ord("u"):
            self.error = "invalid string: forbidden character after backslash"
            return False
        first = self._codepoint()
        if first < 0:
            self.error = _BAD_HEX
            return False
        point = first
        if 0xD800 <= first <= 0xDBFF:
            if not (self.get() == 0x5C and self.get() == ord("u")):
                self.error = _NO_LOW_SURROGATE
                return False
            second = self._codepoint()
            if second < 0:
                self.error = _BAD_HEX
                return False
            if not 0xDC00 <= second <= 0xDFFF:
                self.error = _NO_LOW_SURROGATE
                return False
            point = ((first - 0xD800) << 10) + (second - 0xDC00) + 0x10000
        elif 0xDC00 <= first <= 0xDFFF:
            self.error = _NO_HIGH_SURROGATE
            return False
        self.token_buffer += chr(point).encode()
        return True

    def _codepoint(self) -> int:
        """`get_codepoint`: the 4 hex digits after `\\u`, -1 at the first that is not."""
        point = 0
        for _ in range(4):
            digit = self.get()
            if digit == EOF or chr(digit) not in "0123456789abcdefABCDEF":
                return -1
            point = point * 16 + int(chr(digit), 16)
        return point

    def _number(self) -> int:
        """`scan_number`'s state machine; the byte after the number is read, then ungot."""
        self.reset()
        first = self.current
        self.token_buffer.append(first)
        kind = VALUE_INTEGER if first == 0x2D else VALUE_UNSIGNED
        state = "minus" if first == 0x2D else "zero" if first == 0x30 else "any1"
        while True:
            c = self.get()
            if state in _NEED_DIGIT:
                if c not in _DIGITS:
                    self.error = _NEED_DIGIT[state]
                    return PARSE_ERROR
                state = {"decimal1": "decimal2", "sign": "any2"}.get(state, "any1")
                state = "zero" if state == "any1" and c == 0x30 else state
            elif state == "exponent":
                if c not in _DIGITS and c not in (0x2B, 0x2D):
                    self.error = "invalid number; expected '+', '-', or digit after exponent"
                    return PARSE_ERROR
                state = "any2" if c in _DIGITS else "sign"
            elif c in _DIGITS and state != "zero":
                pass
            elif c == 0x2E and state in ("zero", "any1"):
                kind, state = VALUE_FLOAT, "decimal1"
            elif c in (0x65, 0x45) and state != "any2":
                kind, state = VALUE_FLOAT, "exponent"
            else:
                break
            self.token_buffer.append(c)
        self.unget()
        text = self.token_buffer.decode()
        if kind != VALUE_FLOAT and len(text) <= 21:  # longer: out of 64-bit range anyway
            value = int(text)
            if (kind == VALUE_UNSIGNED and value <= UINT_MAX) or (
                kind == VALUE_INTEGER and value >= INT_MIN
            ):
                self.number = value
                return kind
        self.number = float(text)
        return VALUE_FLOAT

    def string_value(self) -> str:
        return self.token_buffer.decode()
