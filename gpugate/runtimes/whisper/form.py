"""A whisper-server form body, read as cpp-httplib reads it, and where that reading is in doubt.

whisper.cpp's server reads every field of `/load` and `/inference` as a multipart part
(`req.has_file`, `req.get_file_value`), and cpp-httplib decides what those parts are. Line
numbers below are in the `httplib.h` (cpp-httplib 0.20.0) that whisper.cpp 1.8.5 vendors
as `examples/server/httplib.h`:

* the request's `Content-Type` is the **last** such header: headers are an
  `std::unordered_multimap` (L518), whose libstdc++ insertion puts a repeated key before
  the ones already there, and `get_header_value` takes the first of `equal_range` (L4257);
* a header value is percent-decoded as it is read (`parse_header` L4268, `decode_url`
  L2915: `%XX` and `%uXXXX`, no `+`), so `multipart%2Fform-data` is multipart;
* the body is a form when that value starts with `multipart/form-data`, in that case
  (`is_multipart_form_data` L5889); its boundary is what follows the first `boundary=`
  anywhere in it, up to the next `;`, less one pair of double quotes (`parse_multipart_boundary`
  L4869): `xboundary=A; boundary=B` has boundary `A`; none, or an empty one, is a 400;
* the parts (`MultipartFormDataParser::parse` L4955): everything up to the first
  `--BOUNDARY\\r\\n` is skipped, even when it does not start a line; a part's header lines
  end at CRLF, each must be a valid header (`parse_header`), its first may be at most
  8,192 bytes; `Content-Disposition: form-data; ...` (any case) gives its `name` (the first
  `name=`, unquoted or quoted, a missing one is a 400) and its `filename`, any other header
  is ignored, so a `Content-Transfer-Encoding` is never applied: a base64 part's content is
  its base64 text; the content runs to the next `\\r\\n--BOUNDARY`, which must be followed
  by CRLF (another part) or `--` (the end; anything after it is ignored); a body that does
  not end so is a 400; the 1,025th part is a 400 (`CPPHTTPLIB_MULTIPART_FORM_DATA_FILE_MAX_COUNT`);
* a repeated name keeps every part, in order, in an `std::multimap`, and
  `get_file_value` takes the first (`find`, L5898);
* server.cpp passes the content to `is_file_exist` and `whisper_init_from_file_with_params`
  as a C string: a path ends at its first NUL byte.

cpp-httplib parses the body as it reads it from the socket, 4 KiB for the head (whose
tail is the body's first piece), then up to 16 KiB at a time, and two steps of its parser
depend on where those reads end (`parse` L4974, L5081): a `--BOUNDARY\\r\\n` split by a read
is not seen, so the parts may start at a later one; and after the closing delimiter a
later read that starts with CRLF is parsed as more parts. Where the gate's reading of the
whole body could differ from one of those, `FormReading.doubt` says so (`WhisperReading`
refuses such a /load), and every `model` part counts as a model the server may load.
"""

from __future__ import annotations

import re

import attrs

HEADER_MAX_LENGTH = 8192
"""CPPHTTPLIB_HEADER_MAX_LENGTH (httplib.h L90)."""
FILE_MAX_COUNT = 1024
"""CPPHTTPLIB_MULTIPART_FORM_DATA_FILE_MAX_COUNT (httplib.h L98)."""
FORM_DATA = b"multipart/form-data"

_HEX = b"0123456789abcdefABCDEF"
_TOKEN = frozenset(b"!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")
_DISPOSITION = re.compile(rb"Content-Disposition:[ \t\n\v\f\r]*form-data;[ \t\n\v\f\r]*(.*)", re.I)
"""httplib.h L5012, `^Content-Disposition:\\s*form-data;\\s*(.*)$` (icase): std::regex's
`\\s` is isspace in the C locale, and its `.` stops at CR and LF (which `parse_header`
has refused already)."""
_RFC5987 = re.compile(rb"UTF-8''(.+)", re.I | re.S)


def decode_url(value: bytes) -> bytes:
    """httplib.h `decode_url(s, false)` (L2915): `%XX` and `%uXXXX` (as UTF-8; a
    surrogate gives nothing) decoded, anything else kept."""
    out = bytearray()
    i = 0
    size = len(value)
    while i < size:
        char = value[i]
        if char == 0x25 and i + 1 < size:
            if value[i + 1] == 0x75:  # %u
                digits = value[i + 2 : i + 6]
                if len(digits) == 4 and all(d in _HEX for d in digits):
                    code = int(digits, 16)
                    if not 0xD800 <= code < 0xE000:
                        out += chr(code).encode("utf-8")
                    i += 6
                    continue
            else:
                digits = value[i + 1 : i + 3]
                if len(digits) == 2 and all(d in _HEX for d in digits):
                    out.append(int(digits, 16))
                    i += 3
                    continue
        out.append(char)
        i += 1
    return bytes(out)


def boundary_of(content_type: bytes) -> bytes | None:
    """The boundary cpp-httplib takes from a (percent-decoded) Content-Type value; None
    when the value is not `multipart/form-data...` (the body is then no form: no parts);
    b"" when it is but names no usable boundary (cpp-httplib answers 400)."""
    if not content_type.startswith(FORM_DATA):
        return None
    at = content_type.find(b"boundary=")
    if at < 0:
        return b""
    start = at + len(b"boundary=")
    end = content_type.find(b";", start)
    value = content_type[start:] if end < 0 else content_type[start:end]
    if len(value) >= 2 and value[:1] == b'"' and value[-1:] == b'"':
        value = value[1:-1]
    return value


def valid_header(line: bytes) -> bool:
    """httplib.h `parse_header` (L4268) without its callback: a token, a colon, a value of
    visible characters, obs-text, spaces and tabs that starts and ends visibly."""
    line = line.rstrip(b" \t")
    colon = line.find(b":")
    if colon <= 0 or any(c not in _TOKEN for c in line[:colon]):
        return False
    # Trimmed at both ends already, so a space or tab can only be inside it.
    value = line[colon + 1 :].lstrip(b" \t")
    return all((c > 32 and c != 127) or c in b" \t" for c in value)


def _params(text: bytes) -> list[tuple[bytes, bytes]]:
    """httplib.h `parse_disposition_params` (L4880): pieces split at `;` and trimmed of
    spaces and tabs, a repeated piece once; each piece's key is its first `=`-piece and
    its value the last; one pair of double quotes taken off each."""
    seen: set[bytes] = set()
    pairs = []
    for piece in _split(text, b";"):
        if piece in seen:
            continue
        seen.add(piece)
        words = _split(piece, b"=")
        if not words:
            continue
        key, value = words[0], (words[-1] if len(words) > 1 else b"")
        pairs.append((_unquote(key), _unquote(value)))
    return pairs


def _split(text: bytes, sep: bytes) -> list[bytes]:
    """httplib.h `split` (L3010): pieces trimmed of spaces and tabs, empty ones dropped."""
    return [p.strip(b" \t") for p in text.split(sep) if p.strip(b" \t")]


def _unquote(text: bytes) -> bytes:
    return text[1:-1] if len(text) >= 2 and text[:1] == b'"' and text[-1:] == b'"' else text


@attrs.frozen
class FormPart:
    """One part as cpp-httplib keeps it (MultipartFormData)."""

    name: bytes
    content: bytes
    filename: bytes = b""


@attrs.frozen
class FormReading:
    """What cpp-httplib reads of a body, read whole, and whether its reads could differ."""

    parts: tuple[FormPart, ...] = ()
    valid: bool = False
    """Whether cpp-httplib accepts the body (else its answer is 400 and no handler runs)."""
    doubt: str | None = None
    """Why another split of the body into reads could give other parts (None: none can)."""

    def first(self, name: bytes) -> FormPart | None:
        """`req.get_file_value(name)` when the body is valid: its first part of that name."""
        if not self.valid:
            return None
        return next((part for part in self.parts if part.name == name), None)

    def named(self, name: bytes) -> list[FormPart]:
        """Every part of that name that was read, valid body or not."""
        return [part for part in self.parts if part.name == name]


def read_form(body: bytes, boundary: bytes) -> FormReading:
    """The parts of `body` as `MultipartFormDataParser::parse` finds them in one read."""
    start_line = b"--" + boundary + b"\r\n"
    delimiter = b"\r\n--" + boundary
    allowed: set[int] = set()
    parts: list[FormPart] = []
    pos = body.find(start_line)
    valid = False
    if pos >= 0:
        allowed.add(pos)
        pos += len(start_line)
        valid, pos = _parse_parts(body, pos, delimiter, parts, allowed)
    doubt = None
    seen = _occurrences(body, start_line)
    if seen - allowed:
        doubt = f"--{boundary!r} starts a line where it does not delimit a part"
    elif valid and b"\r\n\r\n" in body[pos:]:
        doubt = "the bytes after the closing delimiter could be read as more parts"
    return FormReading(tuple(parts), valid, doubt)


def _parse_parts(
    body: bytes, pos: int, delimiter: bytes, parts: list[FormPart], allowed: set[int]
) -> tuple[bool, int]:
    """Parts from `pos` (just after a `--BOUNDARY\\r\\n`); (valid, where the epilogue starts)."""
    while True:
        header_end = body.find(b"\r\n", pos)
        first = (header_end if header_end >= 0 else len(body)) - pos
        if first > HEADER_MAX_LENGTH:
            return False, pos
        name = filename = None
        while True:
            end = body.find(b"\r\n", pos)
            if end < 0:
                return False, pos  # the headers never end
            if end == pos:
                break
            line = body[pos:end]
            if not valid_header(line):
                return False, pos
            if line[:13].lower() != b"content-type:":
                found = _DISPOSITION.fullmatch(line)
                if found is not None:
                    params = _params(found.group(1))
                    names = [v for k, v in params if k == b"name"]
                    if not names:
                        return False, pos
                    name = names[0]
                    filename = next((v for k, v in params if k == b"filename"), filename)
                    star = next((v for k, v in params if k == b"filename*"), None)
                    if star is not None:
                        encoded = _RFC5987.fullmatch(star)
                        if encoded is None:
                            return False, pos
                        filename = decode_url(encoded.group(1))
            pos = end + 2
        if len(parts) == FILE_MAX_COUNT:
            return False, pos
        pos += 2
        at = body.find(delimiter, pos)
        if at < 0:
            return False, pos  # the content never ends
        parts.append(FormPart(name or b"", body[pos:at], filename or b""))
        pos = at + len(delimiter)
        after = body[pos : pos + 2]
        if after == b"\r\n":
            allowed.add(at + 2)
            pos += 2
            continue
        if after == b"--":
            return True, pos + 2
        return False, pos  # neither: the parser waits for ever


def _occurrences(body: bytes, needle: bytes) -> set[int]:
    found = set()
    at = body.find(needle)
    while at >= 0:
        found.add(at)
        at = body.find(needle, at + 1)
    return found


def path_of(content: bytes) -> bytes:
    """A `model` part as the path server.cpp opens: its C string, up to the first NUL."""
    return content.split(b"\0", 1)[0]
