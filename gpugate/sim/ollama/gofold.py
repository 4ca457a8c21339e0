"""Small pieces of Go the simulated Ollama's reading needs: how encoding/json folds a key,
how strconv quotes a string, how a float64 becomes an int64.

Ollama v0.24.0 is built with Go 1.26 (its go.mod), whose encoding/json is the v1 decoder:
decode.go finds a struct field by the key exactly, else by `foldName(key)` (fold.go), which
upper-cases ASCII letters and maps every other rune to the smallest rune of its
`unicode.SimpleFold` orbit. Only two non-ASCII runes share an orbit with an ASCII letter:
U+212A KELVIN SIGN (K, k) and U+017F LATIN SMALL LETTER LONG S (S, s). Every other
non-ASCII rune folds to a non-ASCII one, so a key holding one never matches a field
(Ollama's field names are ASCII): `ß`, `ı` or `ﬆ` are not `ss`, `i` or `st` to Go, as
they are to Python's str.upper().
"""

from __future__ import annotations

MIN_INT64 = -(1 << 63)
MAX_INT64 = (1 << 63) - 1

_FOLDS = {**{chr(c): chr(c - 32) for c in range(ord("a"), ord("z") + 1)}}
_FOLDS["\u212a"] = "K"
_FOLDS["\u017f"] = "S"
_FOLD_TABLE = str.maketrans(_FOLDS)


def go_fold(key: str) -> str:
    """encoding/json's foldName, as far as an ASCII field name can be matched by it."""
    return key.translate(_FOLD_TABLE)


def go_int64(value: float) -> int:
    """Go's int64(f) on amd64 (CVTTSD2SQ): toward zero; NaN and out of range give MinInt64.

    Options.FromMap sets an int option so from the float64 a JSON number decodes to.
    """
    number = float(value)
    if number != number or not -(2.0**63) <= number < 2.0**63:
        return MIN_INT64
    return int(number)


_ESCAPES = {"\a": "\\a", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t"}
_ESCAPES["\v"] = "\\v"


def go_quote(text: str) -> str:
    """strconv.Quote (fmt's %q of a string or []byte): printable runes as they are,
    others escaped (unicode.IsPrint is Python's isprintable: letters, marks, numbers,
    punctuation, symbols and the ASCII space)."""
    out = ['"']
    for char in text:
        if char in '"\\':
            out.append("\\" + char)
        elif char.isprintable():
            out.append(char)
        elif char in _ESCAPES:
            out.append(_ESCAPES[char])
        elif ord(char) < 0x80:
            out.append(f"\\x{ord(char):02x}")
        elif ord(char) < 0x10000:
            out.append(f"\\u{ord(char):04x}")
        else:
            out.append(f"\\U{ord(char):08x}")
    out.append('"')
    return "".join(out)
