"""aiohttp's server as ComfyUI starts it (server.py `PromptServer`: `web.Application(
client_max_size=100 MiB, middlewares=...)` under `web.AppRunner(app, access_log=None)` and
`web.TCPSite`), with the echo handler on every path: the oracle for the aiohttp dialect."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from aiohttp import web

from tests.dialects.dialect_server import echo_text

MAX_UPLOAD = 100 * 1024 * 1024


async def echo(request: web.Request) -> web.Response:
    """The same answer as dialect_server.echo, from what aiohttp read."""
    body = await request.read()
    if request.path.startswith("/boom"):
        # As ComfyUI's request.json() on a bad body: an unexpected exception.
        raise ValueError("not JSON")
    headers = [(n.decode("latin-1"), v.decode("latin-1")) for n, v in request.raw_headers]
    version = (request.version.major, request.version.minor)
    text = echo_text(request.method, request.raw_path, version, headers, body)
    return web.Response(body=text, content_type="text/plain", charset="utf-8")


@contextlib.asynccontextmanager
async def running() -> AsyncIterator[int]:
    """The server on 127.0.0.1; yields its port."""
    app = web.Application(client_max_size=MAX_UPLOAD)
    app.router.add_route("*", "/{tail:.*}", echo)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    try:
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        yield runner.addresses[0][1]
    finally:
        await runner.cleanup()
