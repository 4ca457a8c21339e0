"""Bytes on the wire as Ollama writes them: Go's JSON, RFC 3339 times, NDJSON and SSE."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime

from aiohttp import web

JSON_UTF8 = "application/json; charset=utf-8"
JSON_PLAIN = "application/json"
NDJSON = "application/x-ndjson"
EVENT_STREAM = "text/event-stream"

_GO_ESCAPES = {
    "<": "\\u003c",
    ">": "\\u003e",
    "&": "\\u0026",
    "\u2028": "\\u2028",
    "\u2029": "\\u2029",
}


def go_json(value: object) -> str:
    """json.Marshal: compact, UTF-8, with Go's HTML-safe escapes of <, > and &."""
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    if any(char in text for char in _GO_ESCAPES):
        text = "".join(_GO_ESCAPES.get(char, char) for char in text)
    return text


def rfc3339(value: datetime | int) -> str:
    """Go's time.Time JSON form: RFC 3339 with the fraction's trailing zeros trimmed.

    An int is nanoseconds since the epoch, shown in UTC (Ollama's `created_at`); a
    datetime keeps its own offset (Ollama's `expires_at` is local time).
    """
    if isinstance(value, int):
        seconds, nanos = divmod(value, 1_000_000_000)
        moment = datetime.fromtimestamp(seconds, UTC)
    else:
        moment = value
        nanos = value.microsecond * 1000
    base = moment.strftime("%Y-%m-%dT%H:%M:%S")
    fraction = f".{nanos:09d}".rstrip("0") if nanos else ""
    offset = moment.utcoffset()
    if offset is None or not offset:
        zone = "Z"
    else:
        minutes = int(offset.total_seconds()) // 60
        sign = "+" if minutes >= 0 else "-"
        zone = f"{sign}{abs(minutes) // 60:02d}:{abs(minutes) % 60:02d}"
    return base + fraction + zone


def now_ns() -> int:
    return time.time_ns()


def json_response(value: object, status: int = 200, content_type: str = JSON_UTF8) -> web.Response:
    """gin's c.JSON: one compact object, no trailing newline."""
    return web.Response(
        body=go_json(value).encode(), status=status, headers={"Content-Type": content_type}
    )


def encoder_response(value: object, status: int = 200) -> web.Response:
    """json.NewEncoder(w).Encode, as Ollama's OpenAI writers answer: a trailing newline."""
    return web.Response(
        body=(go_json(value) + "\n").encode(), status=status, headers={"Content-Type": JSON_PLAIN}
    )


def ndjson_line(value: object) -> bytes:
    return (go_json(value) + "\n").encode()


def sse_event(value: object) -> bytes:
    return f"data: {go_json(value)}\n\n".encode()


SSE_DONE = b"data: [DONE]\n\n"


async def stream_write(
    request: web.Request, response: web.StreamResponse | None, content_type: str, data: bytes
) -> web.StreamResponse:
    """Write to a streamed answer, starting it with its content type on the first write."""
    if response is None:
        response = web.StreamResponse(headers={"Content-Type": content_type})
        await response.prepare(request)
    await response.write(data)
    return response


def api_error(status: int, message: str) -> web.Response:
    """An /api/* error: `{"error": "..."}` with its status."""
    return json_response({"error": message}, status)


def openai_error_body(status: int, message: str) -> dict[str, object]:
    """openai.NewError: the error type follows the status."""
    kind = {400: "invalid_request_error", 404: "not_found_error"}.get(status, "api_error")
    return {"error": {"message": message, "type": kind, "param": None, "code": None}}


def openai_error(status: int, message: str) -> web.Response:
    return encoder_response(openai_error_body(status, message), status)
