"""A chunked request body as cpp-httplib reads it (httplib.py's dialects)."""

from __future__ import annotations

import re

import attrs

from gpugate.proxy.dialects.base import Chunks, Refusal


@attrs.frozen(slots=True)
class HttplibChunkReader:
    """A chunked body as 0.20's `read_content_chunked` reads it: each size line read by
    `strtoul(line, 16)` (leading blanks, a sign, `0x`, hex digits, the rest of the line
    ignored; no digits or an overflow is 400; a negative size wraps to a huge one), the data,
    a line that must be exactly CRLF, and after the zero chunk trailer lines up to a blank
    one. `strict`: llama-server's 0.58 `ChunkedDecoder::read_payload` instead reads a size
    line as 1*HEXDIG, then blanks, then nothing or a `;` extension of blanks and visible
    bytes (`_chunk_size_058`); the rest is read alike."""

    refusal: Refusal
    strict: bool = False
    state: list[object] = attrs.Factory(lambda: ["size", 0])

    def feed(self, data: bytes, date: bytes) -> Chunks:
        """Decode what `data` holds; a partial line is left unused for the next call."""
        out = bytearray()
        pos = 0
        while pos < len(data):
            state, remaining = self.state
            if state == "data":
                take = min(int(remaining), len(data) - pos)  # type: ignore[call-overload]
                out += data[pos : pos + take]
                pos += take
                left = int(remaining) - take  # type: ignore[call-overload]
                self.state[:] = ["data", left] if left else ["crlf", 0]
                continue
            end = data.find(b"\r\n", pos)
            if end < 0:
                break
            line = data[pos:end]
            pos = end + 2
            if state == "crlf":
                if line:
                    return Chunks(bytes(out), pos, False, self.refusal)
                self.state[:] = ["size", 0]
            elif state == "size":
                size = _chunk_size_058(line) if self.strict else _strtoul16(line)
                if size is None:
                    return Chunks(bytes(out), pos, False, self.refusal)
                self.state[:] = ["trailer", 0] if size == 0 else ["data", size]
            elif not line:
                return Chunks(bytes(out), pos, True)
        return Chunks(bytes(out), pos, False)


ULONG_MAX = 2**64 - 1
HEX = frozenset(b"0123456789abcdefABCDEF")


def _strtoul16(line: bytes) -> int | None:
    """C `strtoul(line, &end, 16)` as read_content_chunked checks it: None when no digit
    was read or the value saturated at ULONG_MAX."""
    text = line.lstrip(b" \t\n\v\f\r")
    negative = text[:1] == b"-"
    if text[:1] in (b"+", b"-"):
        text = text[1:]
    if text[:2].lower() == b"0x" and text[2:3] and text[2] in HEX:
        text = text[2:]
    digits = bytearray()
    for byte in text:
        if byte not in HEX:
            break
        digits.append(byte)
    if not digits:
        return None
    value = int(digits, 16)
    if value >= ULONG_MAX:
        return None
    return (ULONG_MAX + 1 - value) % (ULONG_MAX + 1) if negative else value


SIZE_LINE_058 = re.compile(rb"([0-9A-Fa-f]+)[ \t]*(?:;[\x21-\x7e\x80-\xff \t]*)?")
"""0.58's size line: `chunk-size = 1*HEXDIG`, blanks, and a chunk-ext of blanks and
`is_field_vchar` bytes (visible ASCII and obs-text) after a `;`."""


def _chunk_size_058(line: bytes) -> int | None:
    """The size 0.58's `ChunkedDecoder::read_payload` reads from a size line (its CRLF
    off), or None where it fails the body: no leading hex digit, anything but blanks or an
    extension after the digits, or a size past SIZE_MAX."""
    match = SIZE_LINE_058.fullmatch(line)
    if match is None:
        return None
    value = int(match.group(1), 16)
    return None if value > ULONG_MAX else value
