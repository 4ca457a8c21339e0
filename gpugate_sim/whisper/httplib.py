"""cpp-httplib's reading of a request, as whisper-server's build of it runs (httplib.h 0.20.0,
vendored by whisper.cpp 1.8.5 as `examples/server/httplib.h`; line numbers below are in it).

This is the simulator's own port, written from the C++ and kept apart from the gate's
reader (gpugate/runtimes/whisper/form.py): the simulator is the check on the gate, and two
readers that shared code would agree by construction.

* `decode_url` (L2915) undoes `%XX` and `%uXXXX` in the path and in every header value
  (`parse_header` L4268); `+` stays.
* Headers live in an `unordered_multimap` (L518); libstdc++ puts a repeated key ahead of
  the ones it already holds, so `get_header_value` (L4257) finds the **last** one sent.
* `FormParser` is `MultipartFormDataParser` (L4955), fed as the server feeds it: the rest
  of the 4 KiB read that held the end of the head, then reads of up to 16 KiB
  (`SocketStream::read` L6090, `read_content_with_length` L4353, `CPPHTTPLIB_RECV_BUFSIZ`),
  taking every byte as already sent (one write of the whole request, as the gate sends).
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import attrs

HEAD_READ = 4096
"""SocketStream's read_buff_size_ (L3374): the head is read 4 KiB at a time."""
BODY_READ = 16384
"""CPPHTTPLIB_RECV_BUFSIZ (L122)."""
HEADER_MAX_LENGTH = 8192
FILE_MAX_COUNT = 1024

_TOKEN_CHARS = set(b"!#$%&'*+-.^_`|~")
_CD = re.compile(rb"^Content-Disposition:\s*form-data;\s*(.*)$", re.IGNORECASE)
_UTF8_NAME = re.compile(rb"^UTF-8''(.+?)$", re.IGNORECASE)


def _is_hex(c: int) -> bool:
    return 48 <= c <= 57 or 65 <= c <= 70 or 97 <= c <= 102


def _from_hex(s: bytes, i: int, count: int) -> int | None:
    """`from_hex_to_i` (L2716): `count` hex digits at `i`, or None."""
    if i >= len(s):
        return None
    value = 0
    for k in range(count):
        if i + k >= len(s) or not _is_hex(s[i + k]):
            return None
        value = value * 16 + int(chr(s[i + k]), 16)
    return value


def _to_utf8(code: int) -> bytes:
    """`to_utf8` (L2743): a code point as UTF-8; nothing for a surrogate."""
    if 0xD800 <= code < 0xE000:
        return b""
    return chr(code).encode("utf-8")


def decode_url(s: bytes) -> bytes:
    """`decode_url(s, false)`."""
    result = bytearray()
    i = 0
    while i < len(s):
        if s[i] == ord("%") and i + 1 < len(s):
            if s[i + 1] == ord("u"):
                value = _from_hex(s, i + 2, 4)
                if value is not None:
                    result += _to_utf8(value)
                    i += 6
                    continue
            else:
                value = _from_hex(s, i + 1, 2)
                if value is not None:
                    result.append(value)
                    i += 3
                    continue
        result.append(s[i])
        i += 1
    return bytes(result)


def header_value(raw_headers: list[tuple[bytes, bytes]], name: bytes) -> bytes | None:
    """`req.get_header_value(name)`: the last header of that name, trimmed and decoded."""
    found = None
    for key, value in raw_headers:
        if key.lower() == name.lower():
            found = value
    if found is None:
        return None
    return decode_url(found.strip(b" \t"))


def multipart_boundary(content_type: bytes) -> bytes | None:
    """`parse_multipart_boundary` (L4869); None where it returns false."""
    pos = content_type.find(b"boundary=")
    if pos < 0:
        return None
    end = content_type.find(b";", pos)
    value = content_type[pos + 9 : end if end >= 0 else len(content_type)]
    if len(value) >= 2 and value.startswith(b'"') and value.endswith(b'"'):
        value = value[1:-1]
    return value or None


def is_field_value(s: bytes) -> bool:
    """`fields::is_field_content` (L2663)."""

    def vchar(c: int) -> bool:
        return 33 <= c <= 126 or c >= 128

    if not s:
        return True
    if len(s) <= 2:
        return all(vchar(c) for c in s)
    return vchar(s[0]) and vchar(s[-1]) and all(vchar(c) or c in (32, 9) for c in s[1:-1])


def parse_header(line: bytes) -> tuple[bytes, bytes] | None:
    """`parse_header` (L4268): (name, value) or None where it returns false; the value is
    percent-decoded (L4305), as for every header but Location and Referer."""
    end = len(line)
    while end > 0 and line[end - 1] in (32, 9):
        end -= 1
    p = 0
    while p < end and line[p] != ord(":"):
        p += 1
    name = line[:p]
    if not name or not all((chr(c).isalnum() and c < 128) or c in _TOKEN_CHARS for c in name):
        return None
    if p == end:
        return None
    p += 1
    while p < end and line[p] in (32, 9):
        p += 1
    value = line[p:end]
    if not is_field_value(value):
        return None
    if name.lower() in (b"location", b"referer"):
        return name, value
    return name, decode_url(value)


def _split(s: bytes, d: int) -> Iterator[bytes]:
    """`split` (L3010): pieces trimmed of spaces and tabs; empty ones skipped."""
    for piece in s.split(bytes([d])):
        piece = piece.strip(b" \t")
        if piece:
            yield piece


def _trim_quotes(s: bytes) -> bytes:
    return s[1:-1] if len(s) >= 2 and s[:1] == b'"' and s[-1:] == b'"' else s


def disposition_params(s: bytes) -> list[tuple[bytes, bytes]]:
    """`parse_disposition_params` (L4880), in insertion order (a multimap's `find` takes
    the first of a key)."""
    cache: set[bytes] = set()
    params = []
    for kv in _split(s, ord(";")):
        if kv in cache:
            continue
        cache.add(kv)
        key = val = b""
        for word in _split(kv, ord("=")):
            if not key:
                key = word
            else:
                val = word
        if key:
            params.append((_trim_quotes(key), _trim_quotes(val)))
    return params


@attrs.define
class FormFile:
    """MultipartFormData."""

    name: bytes = b""
    filename: bytes = b""
    content_type: bytes = b""
    content: bytearray = attrs.field(factory=bytearray)


class FormParser:
    """MultipartFormDataParser, fed chunk by chunk; `files` in arrival order."""

    def __init__(self, boundary: bytes) -> None:
        self.dash_boundary_crlf = b"--" + boundary + b"\r\n"
        self.crlf_dash_boundary = b"\r\n--" + boundary
        self.state = 0
        self.valid = False
        self.buf = b""
        self.file = FormFile()
        self.files: list[FormFile] = []

    def _find(self, s: bytes) -> int:
        pos = self.buf.find(s)
        return len(self.buf) if pos < 0 else pos

    def parse(self, data: bytes) -> bool:
        """`parse` (L4967): False where the C++ returns false."""
        self.buf += data
        while self.buf:
            if self.state == 0:
                self.buf = self.buf[self._find(self.dash_boundary_crlf) :]
                if len(self.dash_boundary_crlf) > len(self.buf):
                    return True
                self.buf = self.buf[len(self.dash_boundary_crlf) :]
                self.state = 1
            elif self.state == 1:
                self.file = FormFile()
                self.state = 2
            elif self.state == 2:
                pos = self._find(b"\r\n")
                if pos > HEADER_MAX_LENGTH:
                    return False
                while pos < len(self.buf):
                    if pos == 0:
                        if len(self.files) == FILE_MAX_COUNT:
                            self.valid = False
                            return False
                        self.files.append(self.file)
                        self.buf = self.buf[2:]
                        self.state = 3
                        break
                    if not self._header(self.buf[:pos]):
                        self.valid = False
                        return False
                    self.buf = self.buf[pos + 2 :]
                    pos = self._find(b"\r\n")
                if self.state != 3:
                    return True
            elif self.state == 3:
                if len(self.crlf_dash_boundary) > len(self.buf):
                    return True
                pos = self._find(self.crlf_dash_boundary)
                if pos < len(self.buf):
                    self.files[-1].content += self.buf[:pos]
                    self.buf = self.buf[pos + len(self.crlf_dash_boundary) :]
                    self.state = 4
                else:
                    keep = len(self.buf) - len(self.crlf_dash_boundary)
                    if keep > 0:
                        self.files[-1].content += self.buf[:keep]
                        self.buf = self.buf[keep:]
                    return True
            else:
                if len(self.buf) < 2:
                    return True
                if self.buf.startswith(b"\r\n"):
                    self.buf = self.buf[2:]
                    self.state = 1
                elif self.buf.startswith(b"--"):
                    self.valid = True
                    self.buf = b""  # the epilogue
                else:
                    return True
        return True

    def _header(self, header: bytes) -> bool:
        if parse_header(header) is None:
            return False
        if header[:13].lower() == b"content-type:":
            self.file.content_type = header[13:].strip(b" \t")
            return True
        match = _CD.match(header)
        if match is None:
            return True
        params = dict(reversed(disposition_params(match.group(1))))
        if b"name" not in params:
            return False
        self.file.name = params[b"name"]
        if b"filename" in params:
            self.file.filename = params[b"filename"]
        if b"filename*" in params:
            encoded = _UTF8_NAME.match(params[b"filename*"])
            if encoded is None:
                return False
            self.file.filename = decode_url(encoded.group(1))
        return True


def body_reads(head_length: int, body_length: int) -> Iterator[int]:
    """The sizes of the pieces the server hands its body reader, every byte sent at once:
    what is left of the 4 KiB read that ended the head, then reads of up to 16 KiB."""
    first = (HEAD_READ - head_length % HEAD_READ) % HEAD_READ
    left = body_length
    if first and left:
        yield min(first, left)
        left -= min(first, left)
    while left > 0:
        yield min(BODY_READ, left)
        left -= min(BODY_READ, left)
