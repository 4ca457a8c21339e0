"""llama-server's own answers the gate writes: a body past cpp-httplib's payload limit."""

from __future__ import annotations

from collections.abc import Mapping

from gpugate.runtimes.base import Screening
from gpugate.runtimes.replies import BodyLimit, ErrorReply

PAYLOAD_MAX = 100 * 1024 * 1024
"""cpp-httplib's CPPHTTPLIB_PAYLOAD_MAX_LENGTH, which llama-server leaves as it is."""


def llama_too_large(limit: int, seen: int, path: str) -> ErrorReply:
    """cpp-httplib refuses a longer body with 413 before any handler; llama-server's error
    handler writes a body only for 404, so the answer has none."""
    return ErrorReply(413, b"", "text/plain")


LLAMA_BODY_LIMIT = BodyLimit(PAYLOAD_MAX, llama_too_large)


def llama_screening(headers: Mapping[str, str]) -> Screening:
    """The header llama-server's middleware puts on every answer, for those the gate writes
    itself: with its default CORS settings (`--cors-origins *` with credentials) the
    request's Origin echoed, empty without one. (Its `Server: llama.cpp` is not copied: the
    gate's own answers carry no Server header, whichever runtime they stand for.)"""
    origin = headers.get("Origin", "")
    return Screening(reply_headers=(("Access-Control-Allow-Origin", origin),))
