"""Go's text/template lexer (text/template/parse lex.go, Go 1.26), for gotemplate.py.

A state machine over the template text, as Go's: each call of `next_item` runs the state
functions until one emits an item; an error item ends the input. Positions are character
offsets (Go's are byte offsets; only lines reach an error message).
"""

from __future__ import annotations

import enum
import unicodedata

import attrs

from gpugate.sim.ollama.gofold import go_quote as _quote


class Item(enum.IntEnum):
    ERROR = 0
    BOOL = 1
    CHAR = 2
    CHAR_CONSTANT = 3
    COMMENT = 4
    COMPLEX = 5
    ASSIGN = 6
    DECLARE = 7
    EOF = 8
    FIELD = 9
    IDENTIFIER = 10
    LEFT_DELIM = 11
    LEFT_PAREN = 12
    NUMBER = 13
    PIPE = 14
    RAW_STRING = 15
    RIGHT_DELIM = 16
    RIGHT_PAREN = 17
    SPACE = 18
    STRING = 19
    TEXT = 20
    VARIABLE = 21
    KEYWORD = 22
    BLOCK = 23
    BREAK = 24
    CONTINUE = 25
    DOT = 26
    DEFINE = 27
    ELSE = 28
    END = 29
    IF = 30
    NIL = 31
    RANGE = 32
    TEMPLATE = 33
    WITH = 34


_KEYWORDS = {
    ".": Item.DOT, "block": Item.BLOCK, "break": Item.BREAK, "continue": Item.CONTINUE,
    "define": Item.DEFINE, "else": Item.ELSE, "end": Item.END, "if": Item.IF,
    "range": Item.RANGE, "nil": Item.NIL, "template": Item.TEMPLATE, "with": Item.WITH,
}  # fmt: skip
_SPACE = " \t\r\n"
LEFT, RIGHT = "{{", "}}"


@attrs.frozen
class Token:
    typ: Item
    pos: int
    val: str
    line: int

    def __str__(self) -> str:
        """item.String."""
        if self.typ is Item.EOF:
            return "EOF"
        if self.typ is Item.ERROR:
            return self.val
        if self.typ > Item.KEYWORD:
            return f"<{self.val}>"
        if len(self.val.encode()) > 10:
            return _quote(self.val[:10]) + "..."
        return _quote(self.val)


def _unicode(char: str) -> str:
    """fmt's %#U: U+0078 'x' (the character only when printable)."""
    code = f"U+{ord(char):04X}"
    return f"{code} '{char}'" if char.isprintable() else code


def _alphanumeric(char: str) -> bool:
    if char == "_":
        return True
    if not char:
        return False
    category = unicodedata.category(char)
    return category.startswith("L") or category == "Nd"


def _has_left_trim(text: str) -> bool:
    return len(text) >= 2 and text[0] == "-" and text[1] in _SPACE


def _has_right_trim(text: str) -> bool:
    return len(text) >= 2 and text[0] in _SPACE and text[1] == "-"


class Lexer:
    """lex.go: `next_item` runs the state functions until one emits an item."""

    def __init__(self, text: str) -> None:
        self.input = text
        self.pos = self.start = 0
        self.at_eof = False
        self.paren_depth = 0
        self.line = self.start_line = 1
        self.item = Token(Item.EOF, 0, "EOF", 1)
        self.inside_action = False
        self.break_ok = self.continue_ok = True

    # -- reading ---------------------------------------------------------------------------

    def next(self) -> str:
        if self.pos >= len(self.input):
            self.at_eof = True
            return ""
        char = self.input[self.pos]
        self.pos += 1
        if char == "\n":
            self.line += 1
        return char

    def peek(self) -> str:
        char = self.next()
        self.backup()
        return char

    def backup(self) -> None:
        if not self.at_eof and self.pos > 0:
            self.pos -= 1
            if self.input[self.pos] == "\n":
                self.line -= 1

    def this(self, typ: Item) -> Token:
        token = Token(typ, self.start, self.input[self.start : self.pos], self.start_line)
        self.start = self.pos
        self.start_line = self.line
        return token

    def emit(self, typ: Item) -> None:
        self.item = self.this(typ)

    def ignore(self) -> None:
        self.line += self.input.count("\n", self.start, self.pos)
        self.start = self.pos
        self.start_line = self.line

    def accept(self, valid: str) -> bool:
        char = self.next()
        if char and char in valid:
            return True
        self.backup()
        return False

    def accept_run(self, valid: str) -> None:
        while True:
            char = self.next()
            if not char or char not in valid:
                break
        self.backup()

    def errorf(self, message: str) -> None:
        self.item = Token(Item.ERROR, self.start, message, self.start_line)
        self.start = self.pos = 0
        self.input = ""

    def next_item(self) -> Token:
        self.item = Token(Item.EOF, self.pos, "EOF", self.start_line)
        state = self.lex_inside_action if self.inside_action else self.lex_text
        while state is not None:
            state = state()
        return self.item

    # -- states ----------------------------------------------------------------------------

    def lex_text(self):
        found = self.input.find(LEFT, self.pos)
        if found >= 0:
            if found > self.pos:
                self.pos = found
                trim = 0
                if _has_left_trim(self.input[self.pos + len(LEFT) :]):
                    text = self.input[self.start : self.pos]
                    trim = len(text) - len(text.rstrip(_SPACE))
                self.pos -= trim
                self.line += self.input.count("\n", self.start, self.pos)
                token = self.this(Item.TEXT)
                self.pos += trim
                self.ignore()
                if token.val:
                    self.item = token
                    return None
            return self.lex_left_delim
        self.pos = len(self.input)
        if self.pos > self.start:
            self.line += self.input.count("\n", self.start, self.pos)
            self.emit(Item.TEXT)
            return None
        self.emit(Item.EOF)
        return None

    def at_right_delim(self) -> tuple[bool, bool]:
        rest = self.input[self.pos :]
        if _has_right_trim(rest) and rest[2:].startswith(RIGHT):
            return True, True
        return rest.startswith(RIGHT), False

    def lex_left_delim(self):
        self.pos += len(LEFT)
        trim = _has_left_trim(self.input[self.pos :])
        after = 2 if trim else 0
        if self.input.startswith("/*", self.pos + after):
            self.pos += after
            self.ignore()
            return self.lex_comment
        token = self.this(Item.LEFT_DELIM)
        self.inside_action = True
        self.pos += after
        self.ignore()
        self.paren_depth = 0
        self.item = token
        return None

    def lex_comment(self):
        self.pos += 2
        found = self.input.find("*/", self.pos)
        if found < 0:
            self.errorf("unclosed comment")
            return None
        self.pos = found + 2
        delim, trim = self.at_right_delim()
        if not delim:
            self.errorf("comment ends before closing delimiter")
            return None
        self.line += self.input.count("\n", self.start, self.pos)
        self.this(Item.COMMENT)
        if trim:
            self.pos += 2
        self.pos += len(RIGHT)
        if trim:
            rest = self.input[self.pos :]
            self.pos += len(rest) - len(rest.lstrip(_SPACE))
        self.ignore()
        return self.lex_text

    def lex_right_delim(self):
        _, trim = self.at_right_delim()
        if trim:
            self.pos += 2
            self.ignore()
        self.pos += len(RIGHT)
        token = self.this(Item.RIGHT_DELIM)
        if trim:
            rest = self.input[self.pos :]
            self.pos += len(rest) - len(rest.lstrip(_SPACE))
            self.ignore()
        self.inside_action = False
        self.item = token
        return None

    def lex_inside_action(self):
        delim, _ = self.at_right_delim()
        if delim:
            if self.paren_depth == 0:
                return self.lex_right_delim
            self.errorf("unclosed left paren")
            return None
        char = self.next()
        if char == "":
            self.errorf("unclosed action")
        elif char in _SPACE:
            self.backup()
            return self.lex_space
        elif char == "=":
            self.emit(Item.ASSIGN)
        elif char == ":":
            if self.next() != "=":
                self.errorf("expected :=")
            else:
                self.emit(Item.DECLARE)
        elif char == "|":
            self.emit(Item.PIPE)
        elif char == '"':
            return self.lex_quote
        elif char == "`":
            return self.lex_raw_quote
        elif char == "$":
            return self.lex_variable
        elif char == "'":
            return self.lex_char
        elif char == "." and self.pos < len(self.input) and not "0" <= self.input[self.pos] <= "9":
            return self.lex_field
        elif char in "+-." or "0" <= char <= "9":
            self.backup()
            return self.lex_number
        elif _alphanumeric(char):
            self.backup()
            return self.lex_identifier
        elif char == "(":
            self.paren_depth += 1
            self.emit(Item.LEFT_PAREN)
        elif char == ")":
            self.paren_depth -= 1
            if self.paren_depth < 0:
                self.errorf("unexpected right paren")
            else:
                self.emit(Item.RIGHT_PAREN)
        elif ord(char) < 0x80 and char.isprintable():
            self.emit(Item.CHAR)
        else:
            self.errorf(f"unrecognized character in action: {_unicode(char)}")
        return None

    def lex_space(self):
        spaces = 0
        while True:
            char = self.peek()
            if not char or char not in _SPACE:
                break
            self.next()
            spaces += 1
        rest = self.input[self.pos - 1 :]
        if _has_right_trim(rest) and rest[2:].startswith(RIGHT):
            self.backup()
            if spaces == 1:
                return self.lex_right_delim
        self.emit(Item.SPACE)
        return None

    def lex_identifier(self):
        while True:
            char = self.next()
            if _alphanumeric(char):
                continue
            self.backup()
            word = self.input[self.start : self.pos]
            if not self.at_terminator():
                self.errorf(f"bad character {_unicode(char)}")
                return None
            keyword = _KEYWORDS.get(word)
            if keyword is not None and keyword > Item.KEYWORD:
                if (keyword is Item.BREAK and not self.break_ok) or (
                    keyword is Item.CONTINUE and not self.continue_ok
                ):
                    self.emit(Item.IDENTIFIER)
                else:
                    self.emit(keyword)
            elif word[0] == ".":
                self.emit(Item.FIELD)
            elif word in ("true", "false"):
                self.emit(Item.BOOL)
            else:
                self.emit(Item.IDENTIFIER)
            return None

    def lex_field(self):
        return self._field_or_variable(Item.FIELD)

    def lex_variable(self):
        if self.at_terminator():
            self.emit(Item.VARIABLE)
            return None
        return self._field_or_variable(Item.VARIABLE)

    def _field_or_variable(self, typ: Item):
        if self.at_terminator():
            self.emit(Item.VARIABLE if typ is Item.VARIABLE else Item.DOT)
            return None
        while True:
            char = self.next()
            if not _alphanumeric(char):
                self.backup()
                break
        if not self.at_terminator():
            self.errorf(f"bad character {_unicode(char)}")
            return None
        self.emit(typ)
        return None

    def at_terminator(self) -> bool:
        char = self.peek()
        if char == "" or char in _SPACE or char in ".,|:)(":
            return True
        return self.input.startswith(RIGHT, self.pos)

    def lex_char(self):
        while True:
            char = self.next()
            if char == "\\":
                after = self.next()
                if after not in ("", "\n"):
                    continue
                self.errorf("unterminated character constant")
                return None
            if char in ("", "\n"):
                self.errorf("unterminated character constant")
                return None
            if char == "'":
                break
        self.emit(Item.CHAR_CONSTANT)
        return None

    def lex_number(self):
        if not self.scan_number():
            self.errorf(f"bad number syntax: {_quote(self.input[self.start : self.pos])}")
            return None
        if self.peek() in ("+", "-"):
            if not self.scan_number() or self.input[self.pos - 1] != "i":
                self.errorf(f"bad number syntax: {_quote(self.input[self.start : self.pos])}")
                return None
            self.emit(Item.COMPLEX)
            return None
        self.emit(Item.NUMBER)
        return None

    def scan_number(self) -> bool:
        self.accept("+-")
        digits = "0123456789_"
        if self.accept("0"):
            if self.accept("xX"):
                digits = "0123456789abcdefABCDEF_"
            elif self.accept("oO"):
                digits = "01234567_"
            elif self.accept("bB"):
                digits = "01_"
        self.accept_run(digits)
        if self.accept("."):
            self.accept_run(digits)
        if len(digits) == 11 and self.accept("eE"):
            self.accept("+-")
            self.accept_run("0123456789_")
        if len(digits) == 23 and self.accept("pP"):
            self.accept("+-")
            self.accept_run("0123456789_")
        self.accept("i")
        if _alphanumeric(self.peek()):
            self.next()
            return False
        return True

    def lex_quote(self):
        while True:
            char = self.next()
            if char == "\\":
                after = self.next()
                if after not in ("", "\n"):
                    continue
                self.errorf("unterminated quoted string")
                return None
            if char in ("", "\n"):
                self.errorf("unterminated quoted string")
                return None
            if char == '"':
                break
        self.emit(Item.STRING)
        return None

    def lex_raw_quote(self):
        while True:
            char = self.next()
            if char == "":
                self.errorf("unterminated raw quoted string")
                return None
            if char == "`":
                break
        self.emit(Item.RAW_STRING)
        return None
