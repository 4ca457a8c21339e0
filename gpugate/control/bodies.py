"""Reading the control API's requests: what a hostile one gets is an answer in the API's
shape, never a traceback.

A body is JSON text in UTF-8 (RFC 8259 §8.1), whatever its Content-Type says (`curl -d`
sends a form type), and is refused with 400 `BAD_REQUEST` when it is:

* not UTF-8, or not JSON (a byte order mark too: RFC 8259 §8.1 says not to add one);
* `NaN`, `Infinity` or `-Infinity`, which are not JSON (RFC 8259 §6), or a number past a
  double's range (`1e400`), or an integer of more than 4,300 digits (Python's own bound);
* nested deeper than the interpreter recurses (a lease request is one flat object);
* an object with the same key twice: which one counts would be the parser's choice, and the
  token check and the handler must read the same request.

A body past MAX_BODY is 413 `PAYLOAD_TOO_LARGE`. A route no one serves is 404 `NOT_FOUND`,
a method it does not take 405 `METHOD_NOT_ALLOWED` (with `Allow`): `api_errors` gives
every such answer aiohttp raises the same shape.
"""

from __future__ import annotations

import json
import math
from collections.abc import Awaitable, Callable
from http import HTTPStatus
from typing import Any

from aiohttp import web

MAX_BODY = 64 * 1024
"""The most body the control app reads (64 KiB). A lease request is under 300 bytes."""

ERROR_CLASSES = {
    400: "BAD_REQUEST",
    404: "NOT_FOUND",
    405: "METHOD_NOT_ALLOWED",
    413: "PAYLOAD_TOO_LARGE",
}
"""The error class an aiohttp answer of this status gets; another's is its reason phrase."""


class BadRequest(ValueError):
    """The request is not one the route can act on (400); str() says why."""


def error_response(
    status: int, error_class: str, message: str, headers: dict[str, str] | None = None
) -> web.Response:
    """An answer in the control API's error shape."""
    body = {"error": {"class": error_class, "message": message}}
    return web.json_response(body, status=status, headers=headers)


def bad_request(message: str) -> web.Response:
    """400 in the control API's error shape."""
    return error_response(400, "BAD_REQUEST", message)


def _refuse_constant(name: str) -> float:
    raise BadRequest(f"{name} is not a JSON number")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise BadRequest(f"the number {text[:40]} is past a double's range")
    return value


def _unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    found: dict[str, Any] = {}
    for key, value in pairs:
        if key in found:
            raise BadRequest(f"the key {key!r} is given twice in one object")
        found[key] = value
    return found


def parse_json(raw: bytes) -> object:
    """The JSON value `raw` holds; BadRequest saying why when it holds none (or one the
    module docstring refuses)."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BadRequest(f"the body is not UTF-8 (byte {exc.start})") from None
    try:
        return json.loads(
            text,
            parse_constant=_refuse_constant,
            parse_float=_finite,
            object_pairs_hook=_unique,
        )
    except BadRequest:
        raise
    except RecursionError:
        raise BadRequest("the body is nested deeper than any request of this API") from None
    except json.JSONDecodeError as exc:
        raise BadRequest(f"the body is not JSON ({exc.msg} at character {exc.pos})") from None
    except ValueError as exc:
        # An integer past Python's digit limit for int().
        raise BadRequest(f"the body is not JSON this API reads ({exc})") from None


_BODY = web.RequestKey("control_body", object)
"""A request's body as read once: the value, or the BadRequest it gave."""


async def json_body(request: web.Request) -> object:
    """The request's body as JSON (read once, kept for the next reader: the token check
    reads a lease request's `purpose` before its handler reads the rest). BadRequest when
    it is not JSON this API reads; aiohttp's HTTPRequestEntityTooLarge past MAX_BODY."""
    if _BODY not in request:
        try:
            request[_BODY] = parse_json(await request.read())
        except BadRequest as exc:
            request[_BODY] = exc
    found = request[_BODY]
    if isinstance(found, BadRequest):
        raise found
    return found


def _message(request: web.Request, exc: web.HTTPException) -> str:
    if exc.status == 404:
        return f"no route {request.path!r} on the control API (see /gate/v1/openapi.json)"
    if exc.status == 405:
        allowed = exc.headers.get("Allow", "")
        return f"{request.method} is not a method of {request.path} (allowed: {allowed})"
    if exc.status == 413:
        return f"the body is larger than the control API reads ({MAX_BODY} bytes)"
    return exc.text or exc.reason


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@web.middleware
async def api_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """aiohttp's own 4xx answers (no route, a method not allowed, a body too large, a body
    it cannot decode) in the API's error shape, their headers (Allow) kept."""
    try:
        return await handler(request)
    except web.HTTPException as exc:
        if exc.status < 400 or exc.status >= 500:
            raise
        try:
            phrase = HTTPStatus(exc.status).phrase
        except ValueError:
            phrase = "error"
        error_class = ERROR_CLASSES.get(exc.status, phrase.upper().replace(" ", "_"))
        kept = {k: v for k, v in exc.headers.items() if k.lower() not in _NOT_KEPT}
        return error_response(exc.status, error_class, _message(request, exc), kept)


_NOT_KEPT = frozenset({"content-type", "content-length"})
