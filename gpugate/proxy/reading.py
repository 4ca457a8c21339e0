"""A request's framing, expectations and body, read as the runtime's HTTP server reads them.

Framing is the gate's: a request is forwarded only with a body whose end the gate found
itself, framed by the gate (forward.py). What the gate will not frame it refuses here, in
the shape the runtime's server answers such a request with (`ServerDialect`):

* `Transfer-Encoding` other than exactly one `chunked` (Go's net/http answers 501; aiohttp
  accepts `gzip, chunked` as chunked and ignores the gzip, a reading nobody should rely on);
* a websocket handshake that carries a body (nothing can say whether those bytes are the
  body or the first frames);
* an `Expect` the server would not honour.

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

from aiohttp import HttpVersion11, hdrs, web
from aiohttp.http_exceptions import ContentEncodingError
from aiohttp.http_parser import DeflateBuffer

from gpugate.runtimes.dialect import BodyCoding, ServerDialect

if sys.version_info >= (3, 14):
    from compression import zstd
else:
    from backports import zstd

AIOHTTP_ENCODINGS = frozenset({"gzip", "deflate", "br", "zstd"})
"""The Content-Encoding values aiohttp's request parser decodes (the whole value, in any
case; `gzip, identity` is not one of them and reaches the handler as sent)."""


class BodyTooLarge(Exception):
    """The body, as sent or as decoded, is over the consumer's body limit."""

    def __init__(self, size: int) -> None:
        super().__init__(size)
        self.size = size
        """Bytes it had when it passed the limit (its Content-Length, when it says)."""


class Refused(Exception):
    """The runtime's server would refuse this request before its handler runs."""

    def __init__(self, response: web.StreamResponse) -> None:
        super().__init__(response.status)
        self.response = response


def plain(
    status: int, body: bytes, *, close: bool = True, reason: str | None = None
) -> web.Response:
    """A short text answer that ends the connection (the request's end is in doubt)."""
    response = web.Response(
        status=status, reason=reason, body=body, content_type="text/plain", charset="utf-8"
    )
    if close:
        response.force_close()
    return response


def framing_refusal(dialect: ServerDialect, request: web.BaseRequest) -> web.StreamResponse | None:
    """The answer to a request whose framing the gate does not forward (None: go on)."""
    codings = request.headers.getall(hdrs.TRANSFER_ENCODING, [])
    if codings and (len(codings) != 1 or codings[0].strip().lower() != "chunked"):
        if dialect is ServerDialect.GO:
            # net/http: "HTTP/1.1 501 Not Implemented ... Unsupported transfer encoding"
            return plain(501, b"Unsupported transfer encoding")
        return plain(400, b"400 Bad Request")
    if _upgrades(request) and request.body_exists:
        return plain(400, b"400 Bad Request")
    return None


def _upgrades(request: web.BaseRequest) -> bool:
    return bool(request.headers.get(hdrs.UPGRADE)) and any(
        token.strip().lower() == "upgrade"
        for token in request.headers.get(hdrs.CONNECTION, "").split(",")
    )


async def answer_expect(
    dialect: ServerDialect, request: web.BaseRequest
) -> web.StreamResponse | None:
    """Answer an `Expect` header as the runtime's server would: `100 Continue` is sent
    before the body is read; an expectation the server refuses is answered (None: go on)."""
    if request.version != HttpVersion11:
        return None
    expect = request.headers.get(hdrs.EXPECT, "")
    if dialect is ServerDialect.GO:
        tokens = {t.strip().lower() for t in expect.split(",")}
        if "100-continue" not in tokens:
            return plain(417, b"", reason="Expectation Failed")
    elif dialect is ServerDialect.HTTPLIB:
        if expect != "100-continue":
            return None  # cpp-httplib acts on this exact value only
    elif expect.lower() != "100-continue":
        text = f"Unknown Expect: {expect}".encode("utf-8", "surrogateescape")
        return plain(417, text, close=False)
    if request.content.is_eof():
        return None  # the body came with the headers: nothing to invite
    await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
    request.writer.output_size = 0
    await request.writer.drain()
    return None


async def read_body(request: web.BaseRequest, limit: int) -> bytes:
    """The whole request body as sent, refusing more than `limit` bytes."""
    if request.content_length == 0:
        return b""
    if request.content_length is not None:
        if request.content_length > limit:
            raise BodyTooLarge(request.content_length)
        content = request.content
        if content.is_eof():
            # All of it came with the headers (a small request): no wait, no copy per part.
            return content.read_nowait()
        return await content.readexactly(request.content_length)
    chunks = []
    size = 0
    async for chunk in request.content.iter_any():
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge(size)
        chunks.append(chunk)
    return b"".join(chunks)


def decoded_coding(dialect: ServerDialect, request: web.BaseRequest) -> BodyCoding | None:
    """The content coding the runtime's HTTP server undoes before any handler reads the
    body (a route's own decoding is the runtime's: `Reading.decoded_coding`)."""
    if dialect is not ServerDialect.AIOHTTP or not request.body_exists:
        return None
    value = request.headers.get(hdrs.CONTENT_ENCODING, "")
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


def go_error(status: int, message: str) -> web.Response:
    """A Go runtime's JSON error, as gin writes it: `c.JSON(status, gin.H{"error": ...})`."""
    body = json.dumps({"error": message}, separators=(",", ":")).encode()
    return web.Response(status=status, body=body, content_type="application/json", charset="utf-8")
