"""The HTTP server a runtime is built on: how it frames, expects and decodes a request.

The gate reads a request the way the runtime will, and that starts below the JSON: the
runtime's HTTP server decides where a body ends, what an `Expect` header gets, and whether
a `Content-Encoding` is undone before the handler reads the body. Each runtime names its
server here; the listener applies that server's rules (proxy/reading.py).
"""

from __future__ import annotations

import enum

import attrs


class ServerDialect(enum.Enum):
    """The HTTP server behind a runtime's port."""

    GO = "go"
    """Go's net/http (Ollama): bodies are never decoded; one `Transfer-Encoding` only, and
    only `chunked`, else 501; any `Expect` but 100-continue is 417."""
    AIOHTTP = "aiohttp"
    """aiohttp's server (ComfyUI): gzip, deflate, br and zstd bodies are inflated before
    the handler reads them (br and zstd only where their libraries are installed)."""
    HTTPLIB = "httplib"
    """cpp-httplib 0.58 (llama-server): no decoding without zlib, an encoded body is 415."""
    HTTPLIB_0_20 = "httplib-0.20"
    """cpp-httplib 0.20 (whisper.cpp's whisper-server): as HTTPLIB for bodies, but its own
    release's framing (a POST with no length is read to the close), its default headers
    and its error handler's answers."""
    UVICORN = "uvicorn"
    """uvicorn's httptools protocol (vLLM's FastAPI server): llhttp's strict reading, one
    400 for all it refuses, every answer in HTTP/1.1; bodies are never decoded."""


@attrs.frozen
class BodyCoding:
    """A content coding a runtime undoes before it reads a request body, and its bounds."""

    name: str
    """The coding as the listener decodes it: gzip, deflate, br, zstd."""
    window_log_max: int | None = None
    """zstd: the largest window (as a power of two) the runtime's decoder accepts."""
    inflated_limit: int | None = None
    """Bytes the runtime reads of the inflated body; past them it refuses the body (400)."""
