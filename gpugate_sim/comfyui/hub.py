"""The websocket side of the PromptServer: one socket per client id, events in order.

Events are queued and sent by one publisher task, as upstream's `send_sync` hands them
to its `publish_loop`: whoever produces them (a route, the worker) never waits on a slow
socket, and they leave in the order they were produced. `sid=None` means every socket.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import struct
import uuid
from typing import Any

import aiohttp
from aiohttp import web

log = logging.getLogger(__name__)

PREVIEW_IMAGE = 1
TEXT = 3
PREVIEW_IMAGE_WITH_METADATA = 4
JPEG = 1


class Hub:
    """The `sockets` map, the client feature flags, and the publisher."""

    def __init__(self, server_features: dict[str, Any]) -> None:
        self.sockets: dict[str, web.WebSocketResponse] = {}
        self.metadata: dict[str, dict[str, Any]] = {}
        self.server_features = server_features
        self._messages: asyncio.Queue[tuple[int | str, Any, str | None]] = asyncio.Queue()
        self._publisher: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._publisher = asyncio.ensure_future(self._publish())

    async def close(self) -> None:
        if self._publisher is not None:
            self._publisher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._publisher
        for ws in list(self.sockets.values()):
            with contextlib.suppress(Exception):
                await ws.close()

    def send_sync(self, event: int | str, data: Any, sid: str | None = None) -> None:
        """Queue an event for the client `sid` (None: every socket)."""
        self._messages.put_nowait((event, data, sid))

    def supports(self, sid: str | None, feature: str) -> bool:
        if sid is None or sid not in self.metadata:
            return False
        return bool(self.metadata[sid].get("feature_flags", {}).get(feature, False))

    async def drained(self) -> None:
        """Wait until every queued event has been sent."""
        await self._messages.join()

    async def _publish(self) -> None:
        while True:
            event, data, sid = await self._messages.get()
            try:
                await self.send(event, data, sid)
            finally:
                self._messages.task_done()

    async def send(self, event: int | str, data: Any, sid: str | None) -> None:
        if isinstance(event, int):
            message = struct.pack(">I", event) + bytes(data)
            await self._deliver(sid, lambda ws: ws.send_bytes(message))
        else:
            text = json.dumps({"type": event, "data": data})
            await self._deliver(sid, lambda ws: ws.send_str(text))

    async def _deliver(self, sid: str | None, send: Any) -> None:
        targets = list(self.sockets.values()) if sid is None else [self.sockets.get(sid)]
        for ws in targets:
            if ws is None:
                continue
            try:
                await send(ws)
            except (aiohttp.ClientError, ConnectionError) as err:
                log.warning("send error: %s", err)

    async def handle(
        self,
        request: web.Request,
        queue_info: dict[str, Any],
        executing: tuple[str | None, str | None],
    ) -> web.WebSocketResponse:
        """GET /ws: register the socket under its clientId and read what the client says."""
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        sid = request.rel_url.query.get("clientId", "")
        if sid:
            # Reusing a client id: the newest socket takes over, the old one gets nothing.
            self.sockets.pop(sid, None)
        else:
            sid = uuid.uuid4().hex
        self.sockets[sid] = ws
        self.metadata[sid] = {"feature_flags": {}}
        try:
            await self.send("status", {"status": queue_info, "sid": sid}, sid)
            client_id, last_node = executing
            if client_id == sid and last_node is not None:
                await self.send("executing", {"node": last_node}, sid)
            first = True
            async for msg in ws:
                if msg.type == aiohttp.WSMsgType.ERROR:
                    log.warning("ws connection closed with exception %s", ws.exception())
                elif msg.type == aiohttp.WSMsgType.TEXT:
                    try:
                        data = json.loads(msg.data)
                        if first and data.get("type") == "feature_flags":
                            self.metadata[sid]["feature_flags"] = data.get("data", {})
                            await self.send("feature_flags", self.server_features, sid)
                        first = False
                    except json.JSONDecodeError:
                        log.warning("Invalid JSON received from client %s: %s", sid, msg.data)
                    except Exception as exc:
                        log.error("Error processing WebSocket message: %s", exc)
        finally:
            # As upstream: closing an older socket of a reused id unregisters the newer one.
            self.sockets.pop(sid, None)
            self.metadata.pop(sid, None)
        return ws


def preview_frame(image: bytes) -> bytes:
    """PREVIEW_IMAGE payload: image type (1 = JPEG), then the image."""
    return struct.pack(">I", JPEG) + image


def preview_with_metadata(image: bytes, metadata: dict[str, Any]) -> bytes:
    """PREVIEW_IMAGE_WITH_METADATA payload: JSON length, JSON, then the image."""
    text = json.dumps({**metadata, "image_type": "image/jpeg"}).encode()
    return struct.pack(">I", len(text)) + text + image
