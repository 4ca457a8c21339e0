"""A fast stand-in for Ollama: just enough API for the gate to admit, and streams whose
chunks carry the time they were sent; and a websocket sending preview-like binary frames
(ComfyUI's PREVIEW_IMAGE: event type 1, image type 1, then the image), each carrying the
time it was sent.

    python -m bench.upstream --port P
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import struct
import time

from aiohttp import web

MODEL = "bench:latest"
SIZE = 1 << 30
REPLY = json.dumps(
    {
        "model": MODEL,
        "created_at": "2026-11-30T00:00:00Z",
        "response": "ok",
        "done": True,
        "done_reason": "stop",
    }
).encode()


async def generate(request: web.Request) -> web.StreamResponse:
    body = await request.json()
    if not body.get("stream", True):
        return web.Response(body=REPLY, content_type="application/json")
    chunks = int(body.get("options", {}).get("bench_chunks", 50))
    interval = float(body.get("options", {}).get("bench_interval", 0.01))
    response = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})
    await response.prepare(request)
    start = time.monotonic()
    for n in range(chunks):
        line = {"model": MODEL, "response": "x", "done": False, "t": time.monotonic_ns()}
        await response.write(json.dumps(line).encode() + b"\n")
        # Paced against the start, so a slow write does not stretch the stream.
        delay = start + (n + 1) * interval - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
    await response.write(
        json.dumps({"model": MODEL, "done": True, "t": time.monotonic_ns()}).encode() + b"\n"
    )
    await response.write_eof()
    return response


PREVIEW_HEAD = struct.Struct(">IIQ")  # event type, image type, monotonic ns at sending


async def previews(request: web.Request) -> web.StreamResponse:
    """`frames` binary frames of `size` bytes, `fps` a second (0: as fast as they drain)."""
    frames = int(request.query["frames"])
    size = int(request.query["size"])
    fps = float(request.query.get("fps", "0"))
    ws = web.WebSocketResponse(max_msg_size=0, compress=False)
    await ws.prepare(request)
    image = os.urandom(size - PREVIEW_HEAD.size)
    start = time.monotonic()
    for n in range(frames):
        await ws.send_bytes(PREVIEW_HEAD.pack(1, 1, time.monotonic_ns()) + image)
        if fps:
            # Paced against the start, so a slow send does not stretch the stream.
            delay = start + (n + 1) / fps - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
    await ws.close()
    return ws


async def ps(request: web.Request) -> web.Response:
    return web.json_response(
        {
            "models": [
                {
                    "name": MODEL,
                    "model": MODEL,
                    "size": SIZE,
                    "size_vram": SIZE,
                    "expires_at": "2099-01-01T00:00:00Z",
                    "context_length": 4096,
                }
            ]
        }
    )


async def tags(request: web.Request) -> web.Response:
    return web.json_response({"models": [{"name": MODEL, "model": MODEL, "size": SIZE}]})


async def show(request: web.Request) -> web.Response:
    """What the gate asks of a model before it leases a request for it."""
    return web.json_response({"capabilities": ["completion"], "model_info": {}})


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    app = web.Application()
    app.router.add_post("/api/generate", generate)
    app.router.add_get("/api/ps", ps)
    app.router.add_get("/api/tags", tags)
    app.router.add_post("/api/show", show)
    app.router.add_get("/ws", previews)
    import uvloop

    uvloop.install()
    web.run_app(app, host="127.0.0.1", port=args.port, access_log=None, print=None)


if __name__ == "__main__":
    main()
