"""A request's body read as the runtime's HTTP server reads it, and the short answers that
server writes by itself.

Framing, `Expect` and what the server refuses before any handler runs are the dialect's
(proxy/dialects) and the server's (server_reading.py): a request is forwarded only with a body
whose end the gate found itself, framed by the gate (forward.py).

A body the runtime's server decodes before its handler reads it (aiohttp inflates gzip,
deflate, br and zstd) is decoded here with aiohttp's own decoder, bounded by the consumer's
body limit (by default the runtime's own: aiohttp's `client_max_size` bounds the decoded
body too), so the gate reads what the runtime will read; the decoded body is what goes
up. Go's and cpp-httplib's servers decode nothing: their readings take the bytes as sent.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import attrs
from aiohttp.http_exceptions import ContentEncodingError
from aiohttp.http_parser import DeflateBuffer

from gpugate.proxy.request import BodyTooLarge, Request
from gpugate.runtimes.dialect import BodyCoding, ServerDialect

if sys.version_info >= (3, 14):
    from compression import zstd
else:
    from backports import zstd

__all__ = [
    "AIOHTTP_ENCODINGS",
    "BodyTooLarge",
    "Plain",
    "Refused",
    "decode_body",
    "decoded_coding",
    "go_error",
    "inflate_zstd",
    "plain",
]

AIOHTTP_ENCODINGS = frozenset({"gzip", "deflate", "br", "zstd"})
"""The Content-Encoding values aiohttp's request parser decodes (the whole value, in any
case; `gzip, identity` is not one of them and reaches the handler as sent)."""


@attrs.frozen
class Plain:
    """A short answer the runtime's server writes by itself (status, its own headers,
    body), and whether the connection ends after it."""

    status: int
    body: bytes
    headers: tuple[tuple[str, str], ...]
    close: bool


class Refused(Exception):
    """The runtime's server would refuse this request before its handler runs."""

    def __init__(self, answer: Plain) -> None:
        super().__init__(answer.status)
        self.answer = answer


TEXT = (("Content-Type", "text/plain; charset=utf-8"),)


def plain(status: int, body: bytes, *, close: bool = True) -> Plain:
    """A short text answer that ends the connection (the request's end is in doubt)."""
    return Plain(status, body, TEXT, close)


def decoded_coding(dialect: ServerDialect, request: Request) -> BodyCoding | None:
    """The content coding the runtime's HTTP server undoes before any handler reads the
    body (a route's own decoding is the runtime's: `Reading.decoded_coding`)."""
    if dialect is not ServerDialect.AIOHTTP or not request.body.exists:
        return None
    value = request.headers.get("Content-Encoding", "")
    if not value.isascii():
        return None
    value = value.lower()
    return BodyCoding(value) if value in AIOHTTP_ENCODINGS else None


def decode_body(dialect: ServerDialect, coding: BodyCoding, raw: bytes, limit: int) -> bytes:
    """`raw` decoded as the runtime decodes a request body with this coding, at most
    `limit` bytes (BodyTooLarge past it); Refused with the runtime's answer when it cannot
    decode it."""
    if coding.name == "zstd" and dialect is ServerDialect.GO:
        return inflate_zstd(raw, limit, coding)
    if coding.name in ("br", "zstd"):
        # An aiohttp server installed without Brotli or a zstd module (as its runtimes' own
        # requirements leave it) refuses these before any handler runs; decoding them here
        # could lease a request the runtime never reads.
        what = {"br": "brotli (br). Please install `Brotli`"}.get(
            coding.name, "zstandard (zstd). Please install `backports.zstd`"
        )
        raise Refused(plain(400, f"Can not decode content-encoding: {what}".encode()))
    sink = _Sink(limit)
    try:
        inflater = DeflateBuffer(sink, coding.name)  # type: ignore[arg-type]
        more = inflater.feed_data(raw, len(raw))
        while more:
            more = inflater.feed_data(b"", 0)
        inflater.feed_eof()
    except ContentEncodingError as exc:
        # aiohttp answers a coding it cannot decode 400 (no handler runs) and one whose
        # bytes do not decode with the handler's failure, a 500.
        if "install" in str(exc.message):
            raise Refused(plain(400, str(exc.message).encode())) from None
        raise Refused(
            plain(500, b"500 Internal Server Error\n\nServer got itself in trouble")
        ) from None
    return b"".join(sink.parts)


class _Sink:
    """Where DeflateBuffer writes what it decoded (a StreamReader's few members it uses)."""

    _low_water = 1 << 16
    total_compressed_bytes: Any = None

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.size = 0
        self.parts: list[bytes] = []

    def feed_data(self, data: bytes, size: int = 0) -> None:
        self.size += len(data)
        if self.size > self.limit:
            raise BodyTooLarge(self.size)
        self.parts.append(data)

    def feed_eof(self) -> None:
        return None


def inflate_zstd(raw: bytes, limit: int, coding: BodyCoding) -> bytes:
    """A zstd body inflated as a Go runtime's decoder (klauspost/compress) reads a stream:
    frame after frame, skippable frames skipped, no window past `coding.window_log_max`; at
    most `limit` bytes. Refused with the runtime's 400 when it cannot be read."""
    out = bytearray()
    data = raw
    options = {}
    if coding.window_log_max is not None:
        options[zstd.DecompressionParameter.window_log_max] = coding.window_log_max
    most = coding.inflated_limit if coding.inflated_limit is not None else limit
    try:
        while data:
            inflater = zstd.ZstdDecompressor(options=options)
            out += inflater.decompress(data, max_length=max(most, limit) + 1 - len(out))
            if len(out) > limit:
                raise BodyTooLarge(len(out))
            if len(out) > most:
                raise Refused(go_error(400, "http: request body too large"))
            if not inflater.eof:
                raise Refused(go_error(400, "unexpected EOF"))
            data = inflater.unused_data
    except zstd.ZstdError as exc:
        raise Refused(go_error(400, str(exc))) from None
    return bytes(out)


def go_error(status: int, message: str) -> Plain:
    """A Go runtime's JSON error, as gin writes it: `c.JSON(status, gin.H{"error": ...})`."""
    body = json.dumps({"error": message}, separators=(",", ":")).encode()
    return Plain(status, body, (("Content-Type", "application/json; charset=utf-8"),), False)
