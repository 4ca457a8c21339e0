"""uvicorn as vLLM starts it (vllm/entrypoints/launcher.py `serve_http` under `uvloop.run`:
`uvicorn.Config(app, timeout_keep_alive=5, access_log=...)`, the protocol `http="auto"`,
httptools here), serving an ASGI echo on every path: the oracle for the uvicorn dialect.

Run as a program (`python -m tests.dialects.uvicorn_reference`), it serves on a socket of
its own and prints `READY <port>`; `running()` starts it so and stops it after.
"""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

from tests.dialects.dialect_server import echo_text

KEEP_ALIVE = 5


def version_of(http_version: str) -> tuple[int, int]:
    major, _, minor = http_version.partition(".")
    return int(major), int(minor)


async def echo(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """Read the whole body, then answer 200 with what the app saw (dialect_server's
    `echo_text`), Starlette's field order: content-length, content-type. `/boom` raises
    before answering, as a handler's unexpected exception (uvicorn's own 500)."""
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return
    if scope["type"] != "http":
        return
    body = b""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    if scope["path"].startswith("/boom"):
        raise ValueError("not JSON")
    if scope["path"] == "/is_sleeping":
        # vLLM's sleep state, which the gate asks after (runtimes/vllm/sleep.py)
        state = b'{"is_sleeping":false}'
        fields = [(b"content-length", b"%d" % len(state)), (b"content-type", b"application/json")]
        await send({"type": "http.response.start", "status": 200, "headers": fields})
        await send({"type": "http.response.body", "body": state})
        return
    target = scope["raw_path"] + (b"?" + scope["query_string"] if scope["query_string"] else b"")
    headers = [(n.decode("latin-1"), v.decode("latin-1")) for n, v in scope["headers"]]
    version = version_of(scope["http_version"])
    text = echo_text(scope["method"], target.decode("latin-1"), version, headers, body)
    fields = [
        (b"content-length", b"%d" % len(text)),
        (b"content-type", b"text/plain; charset=utf-8"),
    ]
    await send({"type": "http.response.start", "status": 200, "headers": fields})
    await send({"type": "http.response.body", "body": text})


async def _serve() -> None:
    import uvicorn

    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    config = uvicorn.Config(
        echo, timeout_keep_alive=KEEP_ALIVE, access_log=False, log_level="critical"
    )
    # Listening before uvicorn starts: a client that connects first waits in the backlog.
    sock.listen(128)
    print("READY", sock.getsockname()[1], flush=True)
    await uvicorn.Server(config).serve(sockets=[sock])


@contextlib.contextmanager
def running() -> Iterator[int]:
    """The server in a child process; yields its port."""
    process = subprocess.Popen(
        [sys.executable, "-m", "tests.dialects.uvicorn_reference"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        assert line.startswith("READY "), line
        yield int(line.split()[1])
    finally:
        process.terminate()
        process.wait(timeout=30)


if __name__ == "__main__":
    import uvloop

    uvloop.run(_serve())
