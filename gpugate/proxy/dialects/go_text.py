"""Go's net/textproto and net/url as net/http reads a request with them: lines, header
fields, tokens and the request target (GOROOT/src/net/textproto/reader.go, net/url/url.go,
vendor/golang.org/x/net/http/httpguts/httplex.go)."""

from __future__ import annotations

import ipaddress
import re
import urllib.parse

TOKEN = frozenset(b"!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")
"""httpguts `isTokenTable`: the bytes of a method or a field name."""
_SCHEME = frozenset(b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789+-.")
_HEX = frozenset(b"0123456789abcdefABCDEF")
_USERINFO = frozenset(
    b"0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ-._:~!$&'()*+,;=%@"
)
_URL_HOST = frozenset(
    b"0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ-_.~!$&'()*+,;=:[]<>\"%"
)


_BAD_VALUE_BYTE = re.compile(rb"[\x00-\x08\x0a-\x1f\x7f]")
"""The bytes `valid_value_byte` refuses, for a whole value at once."""
_CONTROL = re.compile(rb"[\x00-\x1f\x7f]")
_CANONICAL: dict[bytes, str | None] = {}
"""Names seen, canonical: clients send the same few names in every request."""
_CANONICAL_MOST = 1024
_PLAIN_LINES: dict[bytes, tuple[str, str] | None] = {}
"""Field lines of plain heads, read: clients send the same lines in every request."""
_PLAIN_LINES_MOST = 4096
"""Past this many the memo starts again (lines that never repeat cannot crowd it out)."""
_PLAIN_LINE_LONGEST = 512
"""Longer lines (a large Cookie) are read each time rather than kept."""
UNREAD = object()
"""A line's memo has no entry for it (None is a reading: refused)."""


class Incomplete(Exception):
    """The lines need more bytes."""


class Malformed(Exception):
    """textproto refuses the lines: `str(self)` is its error, its bytes as latin-1."""


def go_quote(data: bytes) -> str:
    """Go's `%q` of a string holding `data` (strconv.Quote: printable runes kept)."""
    out, i = ['"'], 0
    while i < len(data):
        c = data[i]
        rune, size = None, 1
        if c >= 0x80:
            for size in (2, 3, 4):
                try:
                    rune = data[i : i + size].decode("utf-8")
                    break
                except UnicodeDecodeError:
                    continue
            if rune is None:
                out.append(f"\\x{c:02x}")
                i += 1
                continue
        else:
            rune = chr(c)
        if rune in ('"', "\\"):
            out.append("\\" + rune)
        elif rune.isprintable():
            out.append(rune)
        else:
            named = {7: "a", 8: "b", 9: "t", 10: "n", 11: "v", 12: "f", 13: "r"}.get(ord(rune))
            if named:
                out.append("\\" + named)
            elif ord(rune) < 0x80:
                out.append(f"\\x{ord(rune):02x}")
            elif ord(rune) < 0x10000:
                out.append(f"\\u{ord(rune):04x}")
            else:
                out.append(f"\\U{ord(rune):08x}")
        i += size
    out.append('"')
    return "".join(out)


def has_token(value: str, token: str) -> bool:
    """header.go `hasToken`: `token` in `value`, bounded by space, tab or comma, any case."""
    low, token = value.lower(), token.lower()
    start = low.find(token)
    while start >= 0:
        end = start + len(token)
        if (start == 0 or low[start - 1] in " ,\t") and (end == len(low) or low[end] in " ,\t"):
            return True
        start = low.find(token, start + 1)
    return False


def canonical_key(name: bytes) -> str | None:
    """textproto `canonicalMIMEHeaderKey`: None for a name it refuses; one with a space is
    kept as sent."""
    try:
        return _CANONICAL[name]
    except KeyError:
        pass
    key = _canonical_key(name)
    if len(_CANONICAL) < _CANONICAL_MOST:
        _CANONICAL[bytes(name)] = key
    return key


def _canonical_key(name: bytes) -> str | None:
    if not name:
        return None
    if any(c not in TOKEN and c != 0x20 for c in name):
        return None
    if 0x20 in name:
        return name.decode("latin-1")
    out, upper = bytearray(), True
    for c in name:
        if upper and 0x61 <= c <= 0x7A:
            c -= 0x20
        elif not upper and 0x41 <= c <= 0x5A:
            c += 0x20
        out.append(c)
        upper = c == 0x2D
    return out.decode("latin-1")


def valid_value_byte(c: int) -> bool:
    """textproto `validHeaderValueByte`: VCHAR, SP, HTAB and obs-text."""
    return (c >= 0x20 and c != 0x7F) or c == 0x09


def valid_target(target: bytes, connect: bool) -> bool:
    """net/url `ParseRequestURI` accepts it: no control byte, `*`, a path, or a scheme
    (`getScheme`) with an authority whose port is digits and a path whose escapes are whole."""
    if connect and not target.startswith(b"/"):
        target = b"http://" + target
    if not target or _CONTROL.search(target):
        return False
    if target == b"*":
        return True
    scheme, rest = b"", target
    for i, c in enumerate(target):
        if 0x41 <= c <= 0x5A or 0x61 <= c <= 0x7A:
            continue
        if c in _SCHEME and i > 0:
            continue
        if c == 0x3A:
            if i == 0:
                return False  # "missing protocol scheme"
            scheme, rest = target[:i], target[i + 1 :]
        break
    rest = rest[:-1] if rest.endswith(b"?") and rest.count(b"?") == 1 else rest.partition(b"?")[0]
    if not rest.startswith(b"/"):
        return bool(scheme)  # opaque, or "invalid URI for request"
    if scheme and rest.startswith(b"//"):
        authority, slash, tail = rest[2:].partition(b"/")
        if not _valid_authority(authority, scheme):
            return False
        rest = slash + tail
    return _valid_escapes(rest)


def _valid_authority(authority: bytes, scheme: bytes) -> bool:
    """net/url `parseAuthority`: userinfo of `validUserinfo`'s bytes, then `parseHost`."""
    userinfo, at, host = authority.rpartition(b"@")
    if at and (any(c not in _USERINFO for c in userinfo) or not _valid_escapes(userinfo)):
        return False
    bracket = host.rfind(b"[")
    if bracket >= 0:
        # Go 1.26.0 reads the IP-literal after the last "[" wherever it is, and checks
        # nothing before it (Go 1.26.6 and 1.27 refuse a "[" past the start)
        close = host.rfind(b"]")
        if close < 0 or not _valid_port(host[close + 1 :]):
            return False
        inner = host[bracket + 1 : close]
        return _valid_ip_literal(inner) and _valid_host_bytes(host[close + 1 :])
    colon = host.find(b":")
    if colon >= 0:
        # Go 1.26.0: strict colons (GODEBUG urlstrictcolons, on from `go 1.26`), the port
        # after the first colon, for every scheme but postgres and postgresql, whose port
        # is after the last (Go 1.26.6 and 1.27 are strict for http and https only)
        last = scheme.lower() in (b"postgres", b"postgresql")
        start = host.rfind(b":") if last else colon
        if not _valid_port(host[start:]):
            return False
    return _valid_host_bytes(host)


def _valid_port(port: bytes) -> bool:
    """net/url `validOptionalPort`."""
    return not port or (port[:1] == b":" and all(0x30 <= c <= 0x39 for c in port[1:]))


def _valid_ip_literal(inner: bytes) -> bool:
    """Inside brackets: an IPv6 address (netip `ParseAddr`), a zone after `%25`."""
    address, zone, rest = inner.partition(b"%25")
    if not _valid_host_bytes(address) or (zone and not _valid_escapes(rest)):
        return False
    try:
        text = urllib.parse.unquote_to_bytes(address).decode("ascii")
        ip = ipaddress.ip_address(text + ("%" + rest.decode("latin-1") if zone else ""))
    except (ValueError, UnicodeDecodeError):
        return False
    return ip.version == 6


def _valid_host_bytes(host: bytes) -> bool:
    """net/url `unescape` in host mode: bytes `shouldEscape` allows, and escapes that are
    `%25` or of a non-ASCII byte."""
    if not _valid_escapes(host) or any(c < 0x80 and c not in _URL_HOST for c in host):
        return False
    i = host.find(b"%")
    while i >= 0:
        if host[i : i + 3] != b"%25" and int(host[i + 1 : i + 2], 16) < 8:
            return False
        i = host.find(b"%", i + 3)
    return True


def _valid_escapes(path: bytes) -> bool:
    """net/url `unescape`: every `%` starts two hex digits."""
    i = path.find(b"%")
    while i >= 0:
        if len(path) < i + 3 or path[i + 1] not in _HEX or path[i + 2] not in _HEX:
            return False
        i = path.find(b"%", i + 3)
    return True


class Lines:
    """textproto's reading of lines over a buffer: bufio `ReadLine` drops `\\n` or `\\r\\n`."""

    def __init__(self, buffer: bytes, pos: int = 0) -> None:
        self.buffer, self.pos = buffer, pos

    def line(self) -> bytes:
        end = self.buffer.find(b"\n", self.pos)
        if end < 0:
            raise Incomplete
        line = self.buffer[self.pos : end]
        self.pos = end + 1
        return line[:-1] if line.endswith(b"\r") else line

    def peek(self) -> int:
        if self.pos >= len(self.buffer):
            raise Incomplete
        return self.buffer[self.pos]

    def skip_space(self) -> int:
        """textproto `skipSpace`."""
        n = 0
        while self.peek() in (0x20, 0x09):
            self.pos += 1
            n += 1
        return n

    def field(self) -> bytes:
        """textproto `readContinuedLineSlice` with `mustHaveFieldNameColon`."""
        line = self.line()
        if not line:
            return line
        if b":" not in line:
            quoted = go_quote(line).encode().decode("latin-1")  # the error's bytes, as the rest
            raise Malformed("malformed MIME header: missing colon: " + quoted)
        joined = bytearray(line.strip(b" \t"))
        while self.skip_space() > 0:
            joined += b" " + self.line().strip(b" \t")
        return bytes(joined)


def read_fields(lines: Lines) -> list[tuple[str, str]]:
    """textproto `readMIMEHeader`: the fields up to the blank line, canonical and unfolded.

    Go 1.26 reads a request's head and trailer with `ReadMIMEHeader`, which counts no field
    lines (`maxHeaders` is `math.MaxInt64`; the count of 500, `DefaultMaxHeaderValueCount`,
    is Go 1.27's) and quotes no line in its errors (`"...line: " + string(kv)`; `%q` from
    Go 1.26.6 on): the runtime is built with Go 1.26.0."""
    fast = _plain_fields(lines)
    if fast is not None:
        return fast
    fields: list[tuple[str, str]] = []
    if lines.peek() in (0x20, 0x09):
        end = lines.buffer.find(b"\n", lines.pos)
        if end < 0 and len(lines.buffer) - lines.pos < 4096:
            raise Incomplete  # bufio's ReadLine waits for the line or a full buffer
        # readLineSlice(80): a longer first line is "message too large", which Go 1.26's
        # request.go `readRequest` returns as it is (a 400; Go 1.27 makes it a 431)
        line = lines.buffer[lines.pos : end if end >= 0 else len(lines.buffer)]
        line = line[:-1] if line.endswith(b"\r") else line
        if end < 0 or len(line) > 80:
            raise Malformed("message too large")
        lines.pos = end + 1
        raise Malformed("malformed MIME header initial line: " + line.decode("latin-1"))
    while True:
        kv = lines.field()
        if not kv:
            return fields
        name, _, value = kv.partition(b":")
        key = canonical_key(name)
        if key is None or _BAD_VALUE_BYTE.search(value):
            raise Malformed("malformed MIME header line: " + kv.decode("latin-1"))
        fields.append((key, value.lstrip(b" \t").decode("latin-1")))


def _plain_fields(lines: Lines) -> list[tuple[str, str]] | None:
    """The common head read at once: complete, every line ended by CRLF and no other CR or
    LF, none folded, each with a colon, a known name and a plain value.
    Anything else is None, and `read_fields` reads it line by line (which is what decides
    every refusal); on what this accepts both give the same fields (tests/dialects)."""
    buffer, pos = lines.buffer, lines.pos
    if buffer[pos - 2 : pos] != b"\r\n":
        return None
    end = buffer.find(b"\r\n\r\n", pos - 2)
    if end < 0:
        return None
    if end < pos:
        lines.pos = pos + 2  # no fields: the blank line right after the request line
        return []
    block = buffer[pos:end]
    pairs = block.count(b"\r\n")
    if (
        block.count(b"\n") != pairs
        or block.count(b"\r") != pairs
        or block[:1] in (b" ", b"\t")
        or b"\r\n " in block
        or b"\r\n\t" in block
    ):
        return None
    fields: list[tuple[str, str]] = []
    memo = _PLAIN_LINES
    for line in block.split(b"\r\n"):
        field = memo.get(line, UNREAD)
        if field is UNREAD:
            field = _plain_line(line)
        if field is None:
            return None
        fields.append(field)  # type: ignore[arg-type]
    lines.pos = end + 4
    return fields


def _plain_line(line: bytes) -> tuple[str, str] | None:
    """One line of a plain head as a field (canonical name, value), None where
    `read_fields` must judge it; kept in `_PLAIN_LINES` (a pure reading of the line)."""
    name, colon, value = line.strip(b" \t").partition(b":")
    key = canonical_key(name) if colon else None
    field = None
    if key is not None and not _BAD_VALUE_BYTE.search(value):
        field = (key, value.lstrip(b" \t").decode("latin-1"))
    if len(line) <= _PLAIN_LINE_LONGEST:
        if len(_PLAIN_LINES) >= _PLAIN_LINES_MOST:
            _PLAIN_LINES.clear()
        _PLAIN_LINES[bytes(line)] = field
    return field


def has_token_list(value: str, token: str) -> bool:
    """httpguts `headerValueContainsToken`: `token` is one of the comma-separated elements."""
    return any(part.strip(" \t").lower() == token for part in value.split(","))
