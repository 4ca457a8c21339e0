"""strconv's and fmt's reading of the literals in a Go template (text/template/parse
node.go newNumber, parse.go's strconv.Unquote), with their error texts."""

from __future__ import annotations

import re

from gpugate.sim.ollama.gofold import go_quote as _quote
from gpugate.sim.ollama.gotemplate_lex import Item


class TemplateError(ValueError):
    """A template text/template refuses; the message is Go's."""


_SIMPLE_ESCAPES = "abfnrtv\\"
_HEX = "0123456789abcdefABCDEF"


def _unquote_char(text: str, quote: str) -> tuple[str, str]:
    """strconv.UnquoteChar: the first character of `text` and the rest; TemplateError's
    "invalid syntax" (strconv.ErrSyntax) where Go refuses it."""
    invalid = TemplateError("invalid syntax")
    if not text:
        raise invalid
    char = text[0]
    if char == quote and quote in "'\"":
        raise invalid
    if char != "\\":
        return char, text[1:]
    if len(text) <= 1:
        raise invalid
    kind, rest = text[1], text[2:]
    if kind in _SIMPLE_ESCAPES:
        return kind, rest
    if kind in "xuU":
        size = {"x": 2, "u": 4, "U": 8}[kind]
        digits = rest[:size]
        if len(digits) < size or any(d not in _HEX for d in digits):
            raise invalid
        value = int(digits, 16)
        if kind != "x" and (value > 0x10FFFF or 0xD800 <= value <= 0xDFFF):
            raise invalid
        return chr(value), rest[size:]
    if "0" <= kind <= "7":
        digits = text[1:4]
        if len(digits) < 3 or any(not "0" <= d <= "7" for d in digits):
            raise invalid
        if int(digits, 8) > 255:
            raise invalid
        return chr(int(digits, 8)), text[4:]
    if kind in "'\"":
        if kind != quote:
            raise invalid
        return kind, rest
    raise invalid


def unquote(text: str) -> str:
    """strconv.Unquote of a lexed string token (raw strings always unquote)."""
    if text.startswith("`"):
        return text[1:-1].replace("\r", "")
    body, out = text[1:-1], []
    while body:
        char, body = _unquote_char(body, '"')
        out.append(char)
    return "".join(out)


_D = r"[0-9](?:_?[0-9])*"
_X = r"[0-9a-fA-F](?:_?[0-9a-fA-F])*"
_UINT = re.compile(
    r"0[xX](?:_?[0-9a-fA-F])+|0[bB](?:_?[01])+|0[oO](?:_?[0-7])+|0(?:_?[0-7])*|[1-9](?:_?[0-9])*"
)
_FLOAT = re.compile(
    rf"[+-]?(?:(?:{_D}\.(?:{_D})?|\.{_D}|{_D})(?:[eE][+-]?{_D})?"
    rf"|0[xX]_?(?:{_X}\.?(?:{_X})?|\.{_X})[pP][+-]?{_D})"
)


def _integer(text: str, signed: bool) -> int | None:
    """strconv.ParseInt or ParseUint with base 0, 64 bits; None where it fails."""
    sign = 1
    digits = text
    if signed and text[:1] in "+-":
        sign = -1 if text[0] == "-" else 1
        digits = text[1:]
    if not _UINT.fullmatch(digits):
        return None
    clean = digits.replace("_", "").lower()
    if clean[:2] in ("0x", "0b", "0o"):
        value = int(clean[2:], {"x": 16, "b": 2, "o": 8}[clean[1]])
    else:
        value = int(clean, 8 if len(clean) > 1 and clean[0] == "0" else 10)
    value *= sign
    if signed:
        return value if -(1 << 63) <= value < (1 << 63) else None
    return value if value < (1 << 64) else None


def _float(text: str) -> float | None:
    """strconv.ParseFloat(text, 64); None where it fails (out of range too)."""
    return None if _float_error(text) else 0.0


def _float_error(text: str) -> str:
    """strconv.ParseFloat(text, 64)'s error ("" when it parses)."""
    if not _FLOAT.fullmatch(text):
        return f"strconv.ParseFloat: parsing {_quote(text)}: invalid syntax"
    clean = text.replace("_", "")
    value = float.fromhex(clean) if "x" in clean.lower() else float(clean)
    if value in (float("inf"), float("-inf")):
        return f"strconv.ParseFloat: parsing {_quote(text)}: value out of range"
    return ""


def _float_token(text: str) -> str:
    """fmt's ss.floatToken: the longest float-looking prefix (no NaN or Inf here)."""
    pos = 1 if text[:1] in "+-" else 0
    digits, exponent = "0123456789_", "eEp"
    if text[pos : pos + 2] in ("0x", "0X"):
        pos, digits, exponent = pos + 2, "0123456789aAbBcCdDeEfF_", "pP"
    while pos < len(text) and text[pos] in digits:
        pos += 1
    if text[pos : pos + 1] == ".":
        pos += 1
        while pos < len(text) and text[pos] in digits:
            pos += 1
    if pos < len(text) and text[pos] in exponent:
        pos += 1
        if text[pos : pos + 1] in ("+", "-"):
            pos += 1
        while pos < len(text) and text[pos] in "0123456789_":
            pos += 1
    return text[:pos]


def _complex_error(text: str) -> str | None:
    """fmt.Sscan of a complex128 (node.go newNumber): real part, sign, imaginary, `i`."""
    real = _float_token(text)
    rest = text[len(real) :]
    if rest[:1] not in ("+", "-") or not rest:
        return "syntax error scanning complex number"
    imaginary = rest[0] + _float_token(rest[1:])
    if not text[len(real) + len(imaginary) :].startswith("i"):
        return "syntax error scanning complex number"
    return _float_error(real) or _float_error(imaginary) or None


def number_error(text: str, typ: Item) -> str | None:
    """Tree.newNumber's error for a number token (node.go), if any."""
    if typ is Item.CHAR_CONSTANT:
        try:
            _, tail = _unquote_char(text[1:], text[0])
        except TemplateError as exc:
            return str(exc)
        return None if tail == "'" else f"malformed character constant: {text}"
    if typ is Item.COMPLEX:
        return _complex_error(text)
    if text.endswith("i") and _float(text[:-1]) is not None:
        return None
    if _integer(text, signed=False) is not None or _integer(text, signed=True) is not None:
        return None
    if _float(text) is not None:
        if not any(c in text for c in ".eEpP"):
            return f"integer overflow: {_quote(text)}"
        return None
    return f"illegal number syntax: {_quote(text)}"
