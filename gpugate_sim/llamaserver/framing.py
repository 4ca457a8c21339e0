"""llama-server's HTTP layer (tools/server/server-http.cpp, server.cpp) on aiohttp.

What every answer goes through, in the real server's order:

* the pre-routing handler: `Access-Control-Allow-Origin` (with the default `*` origins and
  credentials on, the request's own `Origin` is echoed, empty without one); an `OPTIONS`
  request is answered at once (200, empty `text/html`, the `Access-Control-Allow-*`
  headers); before the model is loaded every other path is refused with 503
  `Loading model` (`middleware_server_state`); then the API key check (not modelled);
* `ex_wrapper` (server.cpp): a handler's `std::invalid_argument` is a 400
  `invalid_request_error`, any other exception (a JSON parse error among them) a 500
  `server_error`, both `{"error":{"code","message","type"}}`;
* the error handler: a 404 (no route, or a route without that method) answers
  `{"error":{"code":404,"message":"File Not Found","type":"not_found_error"}}`;
* `Server: llama.cpp` on every answer (httplib's default headers).

JSON is written as the server's `json` (nlohmann::ordered_json) dumps it: keys in the
order the source builds them, no spaces, UTF-8 unescaped.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from gpugate_sim.llamaserver import nlohmann

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
JSON_TYPE = "application/json; charset=utf-8"

INVALID_REQUEST = "invalid_request_error"
NOT_FOUND = "not_found_error"
SERVER_ERROR = "server_error"
NOT_SUPPORTED = "not_supported_error"
UNAVAILABLE = "unavailable_error"
_CODES = {
    INVALID_REQUEST: 400,
    "authentication_error": 401,
    NOT_FOUND: 404,
    SERVER_ERROR: 500,
    "permission_error": 403,
    NOT_SUPPORTED: 501,
    UNAVAILABLE: 503,
    "exceed_context_size_error": 400,
}


class InvalidArgument(Exception):
    """std::invalid_argument thrown by a handler: ex_wrapper answers 400."""


class ServerError(Exception):
    """Any other std::exception thrown by a handler: ex_wrapper answers 500."""


def dumps(value: Any) -> str:
    """`safe_json_to_str`: ordered_json's dump(-1), keys in insertion order."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def json_response(value: Any, status: int = 200) -> web.Response:
    return web.Response(status=status, body=dumps(value).encode(), content_type=None,
                        headers={"Content-Type": JSON_TYPE})  # fmt: skip


def error_body(message: str, kind: str) -> dict[str, Any]:
    """`format_error_response` (server-common.cpp)."""
    return {"code": _CODES[kind], "message": message, "type": kind}


def error_response(message: str, kind: str) -> web.Response:
    """`res->error(format_error_response(...))`: the status is the error's code."""
    body = error_body(message, kind)
    return json_response({"error": body}, status=body["code"])


def parse_json(raw: bytes) -> Any:
    """`json::parse(req.body)`; ServerError with nlohmann's message when it is not JSON.

    nlohmann's exceptions are std::exception but not std::invalid_argument, so ex_wrapper
    answers 500 (nlohmann.py words the message as nlohmann does).
    """
    value = nlohmann.parse(raw)
    if isinstance(value, nlohmann.JsonError):
        raise ServerError(value.message)
    return value


NOT_FOUND_BODY = dumps({"error": {"message": "File Not Found", "type": NOT_FOUND, "code": 404}})
LOADING_BODY = dumps({"error": {"message": "Loading model", "type": UNAVAILABLE, "code": 503}})


def make_middleware(is_ready: Callable[[], bool]) -> Any:
    """The pre-routing handler, ex_wrapper and the error handler around every route."""

    @web.middleware
    async def httplib(request: web.Request, handler: Handler) -> web.StreamResponse:
        origin = request.headers.get("Origin", "")
        if request.method == "OPTIONS":
            response: web.StreamResponse = web.Response(status=200, body=b"",
                                                        content_type="text/html")  # fmt: skip
            response.headers["Access-Control-Allow-Credentials"] = "true"
            response.headers["Access-Control-Allow-Methods"] = "GET, POST, DELETE, OPTIONS"
            response.headers["Access-Control-Allow-Headers"] = "*"
        elif not is_ready():
            response = _raw(503, LOADING_BODY)
        else:
            try:
                response = await handler(request)
            except web.HTTPException as exc:
                if exc.status in (404, 405):
                    response = _raw(404, NOT_FOUND_BODY)
                else:
                    raise
            except InvalidArgument as exc:
                response = error_response(str(exc), INVALID_REQUEST)
            except ServerError as exc:
                response = error_response(str(exc), SERVER_ERROR)
        if response.status == 404 and not response.prepared:
            # The error handler rewrites every 404, a handler's own body included.
            response = _raw(404, NOT_FOUND_BODY)
        if not response.prepared:
            response.headers["Server"] = "llama.cpp"
            response.headers["Access-Control-Allow-Origin"] = origin
            keep_alive(request, response)
        return response

    return httplib


def keep_alive(request: web.Request, response: web.StreamResponse) -> None:
    """cpp-httplib closes the connection after an error status; otherwise it says how long
    it keeps it (5 s, 100 requests)."""
    if response.status >= 400 or not request.keep_alive:
        response.force_close()
    else:
        response.headers["Keep-Alive"] = "timeout=5, max=100"


def _raw(status: int, body: str) -> web.Response:
    return web.Response(status=status, body=body.encode(), headers={"Content-Type": JSON_TYPE})


async def start_sse(request: web.Request) -> web.StreamResponse:
    """A streamed answer as process_handler_response sends one: chunked, text/event-stream,
    `X-Accel-Buffering: no`, headers sent with the first chunk."""
    response = web.StreamResponse(status=200)
    response.headers["Server"] = "llama.cpp"
    response.headers["Access-Control-Allow-Origin"] = request.headers.get("Origin", "")
    response.headers["X-Accel-Buffering"] = "no"
    response.headers["Content-Type"] = "text/event-stream"
    keep_alive(request, response)
    response.enable_chunked_encoding()
    await response.prepare(request)
    return response


async def end_chunked(request: web.Request, response: web.StreamResponse) -> None:
    """End an answer; a chunked one ends its connection too, as llama-server's do: its
    stream provider returns false once done, which cpp-httplib takes as a cancelled write
    and closes (server-http.cpp `chunked_content_provider`, httplib.cpp
    `write_content_chunked`), though the answer said `Keep-Alive`."""
    await response.write_eof()
    if response.chunked and request.transport is not None:
        request.transport.close()


def sse_event(value: Any) -> bytes:
    """`format_oai_sse` of one item."""
    return f"data: {dumps(value)}\n\n".encode()


DONE = b"data: [DONE]\n\n"
