"""A response the gate writes itself; the shapes each runtime's clients parse build on it."""

from __future__ import annotations

import attrs


@attrs.frozen
class ErrorReply:
    """A response the gate writes itself, in the client's shape."""

    status: int
    body: bytes
    content_type: str
    failure_class: str | None = None
    retry_after: float | None = None
    headers: tuple[tuple[str, str], ...] = ()
    """More headers, in order (CORS headers on a refusal or a preflight answer)."""
