"""The simulator's socket: aiohttp's low-level server, made to take a request as cpp-httplib
takes it where aiohttp's own request parser would refuse it first.

cpp-httplib keeps every header line in a multimap and reads the last of a name (httplib.h
L4257); aiohttp's request parser refuses a repeated `Content-Type`, `Host`, `User-Agent`
and the other RFC 9110 singletons with a 400 of its own. The simulator parses with
aiohttp's pure-Python parser, told to refuse repeats only of the headers that frame the
body (whose reading stays aiohttp's); the handler then reads headers as cpp-httplib does
(httplib.py `header_value`). There is no application and no router: cpp-httplib routes on
its own decoding of the path (server.py).
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any

import aiohttp.http_parser as http_parser
from aiohttp import web
from aiohttp.web_protocol import RequestHandler, RequestPayloadError

FRAMING = frozenset({"content-length", "transfer-encoding"})
READ_BUFSIZE = 2**16
QUEUE = 32


DEFAULT_HEADERS = (
    ("Server", "whisper.cpp"),
    ("Access-Control-Allow-Origin", "*"),
    ("Access-Control-Allow-Headers", "content-type, authorization"),
)
"""server.cpp's `set_default_headers`: on every answer, cpp-httplib's own refusals too."""


class HttplibHandler(RequestHandler):
    """One connection: a request line or header aiohttp cannot parse is answered as
    cpp-httplib answers what it cannot parse (`process_request` L7260): a 400 its error
    handler words `Invalid request`."""

    def handle_error(
        self,
        request: web.BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        if status != 400:
            return super().handle_error(request, status, exc, message)
        response = web.Response(status=400, body=b"Invalid request")
        response.headers["Content-Type"] = "text/plain"
        response.headers.extend(DEFAULT_HEADERS)
        response.headers["Keep-Alive"] = "timeout=5, max=100"
        response.force_close()
        return response


class HttplibServer(web.Server):
    """web.Server whose connections parse requests with repeated headers kept."""

    def __call__(self) -> RequestHandler:
        handler = HttplibHandler(self, loop=self._loop, **self._kwargs)
        # Only this process's pure-Python parser reads the set (the gate's listener, in
        # its own process, keeps aiohttp's C parser and its refusals).
        http_parser.SINGLETON_HEADERS = FRAMING  # type: ignore[misc]
        handler._parser = http_parser.HttpRequestParserPy(
            handler,
            self._loop,
            READ_BUFSIZE,
            payload_exception=RequestPayloadError,
            auto_decompress=False,
            max_msg_queue_size=QUEUE,
        )
        return handler


def _request(
    message: Any, payload: Any, protocol: Any, writer: Any, task: asyncio.Task[None]
) -> web.BaseRequest:
    # cpp-httplib sets no payload limit (CPPHTTPLIB_PAYLOAD_MAX_LENGTH is SIZE_MAX).
    return web.BaseRequest(
        message, payload, protocol, writer, task, task.get_loop(), client_max_size=sys.maxsize
    )


def httplib_runner(handler: Any, *, keepalive_timeout: float) -> web.ServerRunner:
    """A runner for `handler` (one coroutine for every request)."""
    server = HttplibServer(
        handler,
        request_factory=_request,
        keepalive_timeout=keepalive_timeout,
        access_log=None,
        auto_decompress=False,
    )
    return web.ServerRunner(server)
