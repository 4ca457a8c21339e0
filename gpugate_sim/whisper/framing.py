"""What cpp-httplib does with a request before whisper-server's handlers see it: its path,
its body and its parts (httplib.h 0.20.0 as whisper.cpp 1.8.5 vendors it; the reading
itself is httplib.py).

`Server::routing` (httplib.h L7022) reads the body of every POST, PUT, PATCH and DELETE
and of anything with a Content-Length or chunked framing (`expect_content` L5459) before it
looks for a handler, so a form it cannot read is a 400 on any path. `read_content_core`
(L6806) refuses an encoded body (415, `prepare_content_receiver` L4474: built without
zlib, Brotli or zstd) and a form without a boundary (400) before it reads any of it, and
stops reading at the first piece its form parser refuses. What it did not read stays on
the connection, and since each request gets a new `SocketStream` (`process_server_socket`
L3463), the rest of the read that held the refused piece is lost and the next request is
read from what follows: `Content.unread`.
"""

from __future__ import annotations

import attrs
from aiohttp import web

from gpugate_sim.whisper.httplib import (
    FormFile,
    FormParser,
    body_reads,
    decode_url,
    header_value,
    multipart_boundary,
)

CONTENT_METHODS = ("POST", "PUT", "PATCH", "DELETE")


@attrs.frozen
class Content:
    """A request's body as cpp-httplib read it."""

    files: dict[str, FormFile] = attrs.field(factory=dict)
    """`req.get_file_value`: the first part of each name."""
    status: int | None = None
    """The status cpp-httplib answers instead of routing (400, 415); None: it routes."""
    unread: bytes = b""
    """Bytes of the body it never read, which it then reads as the next request."""


def httplib_path(raw_path: str) -> str:
    """`parse_request_line` (L6564): the target before `#` and `?`, percent-decoded."""
    target = raw_path.split("#", 1)[0].split("?", 1)[0]
    raw = target.encode("utf-8", "surrogateescape")
    return decode_url(raw).decode("utf-8", "surrogateescape")


def head_length(request: web.BaseRequest) -> int:
    """The request's head as the gate (or a plain client) writes it: one space after each
    colon, CRLF line ends."""
    line = (
        f"{request.method} {request.raw_path} HTTP/{request.version.major}.{request.version.minor}"
    )
    size = len(line.encode("utf-8", "surrogateescape")) + 2
    for name, value in request.raw_headers:
        size += len(name) + 2 + len(value) + 2
    return size + 2


def expects_content(request: web.BaseRequest) -> bool:
    """`expect_content` (L5459)."""
    if request.method in CONTENT_METHODS:
        return True
    length = header_value(list(request.raw_headers), b"content-length")
    if length is not None and length.isdigit() and int(length) > 0:
        return True
    coding = header_value(list(request.raw_headers), b"transfer-encoding")
    return coding is not None and coding.lower() == b"chunked"


def encoded(request: web.BaseRequest) -> bool:
    """`prepare_content_receiver`: a Content-Encoding it would have to decode."""
    coding = header_value(list(request.raw_headers), b"content-encoding") or b""
    return coding in (b"gzip", b"deflate", b"zstd") or b"br" in coding


async def read_content(request: web.BaseRequest) -> Content:
    """The body read as `Server::read_content` reads it."""
    headers = list(request.raw_headers)
    chunked = request.headers.get("Transfer-Encoding", "").lower() == "chunked"
    body = await request.read()
    first = next(iter(body_reads(head_length(request), len(body))), 0)
    if encoded(request):
        return Content(status=415, unread=b"" if chunked else body[first:])
    content_type = header_value(headers, b"content-type") or b""
    if not content_type.startswith(b"multipart/form-data"):
        return Content()
    boundary = multipart_boundary(content_type)
    if boundary is None:
        return Content(status=400, unread=b"" if chunked else body[first:])
    parser = FormParser(boundary)
    consumed = 0
    for size in body_reads(head_length(request), len(body)):
        piece = body[consumed : consumed + size]
        consumed += size
        if not parser.parse(piece):
            return Content(status=400, unread=b"" if chunked else body[consumed:])
    if not parser.valid:
        return Content(status=400)
    files: dict[str, FormFile] = {}
    for file in parser.files:
        files.setdefault(file.name.decode("utf-8", "surrogateescape"), file)
    return Content(files)
