"""An upstream that misbehaves on purpose: it accepts and never answers, or stops mid-stream.

`/api/ps` and other listings are answered normally (an empty listing), so the gate's own
calls succeed and only the inference request meets the fault.
"""

from __future__ import annotations

import asyncio
import enum
import json

import attrs


class Hang(enum.Enum):
    BEFORE_HEADERS = "before_headers"
    MID_STREAM = "mid_stream"


@attrs.define
class HostileUpstream:
    """A raw HTTP/1.1 server on loopback; `open` counts inference requests still connected."""

    hang: Hang
    port: int = 0
    open: int = 0
    served: int = 0
    _server: asyncio.Server | None = None
    _changed: asyncio.Event = attrs.field(factory=asyncio.Event)
    _writers: set[asyncio.StreamWriter] = attrs.field(factory=set)

    async def start(self) -> HostileUpstream:
        self._server = await asyncio.start_server(self._client, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            for writer in list(self._writers):
                writer.close()

    async def wait_closed_requests(self, timeout: float = 5.0) -> None:
        """Until every inference request it received was closed by the other side."""
        async with asyncio.timeout(timeout):
            while self.open:
                self._changed.clear()
                await self._changed.wait()

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
            writer.close()
            return
        method, path = head.split(b" ", 2)[:2]
        length = 0
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value.strip())
        if length:
            await reader.readexactly(length)
        if method == b"GET" or path in (b"/api/show", b"/api/tags"):
            body = json.dumps({"models": []} if path != b"/api/version" else {"version": "0.33.0"})
            writer.write(
                b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n"
                + f"Content-Length: {len(body)}\r\n\r\n{body}".encode()
            )
            await writer.drain()
            writer.close()
            return
        self._writers.add(writer)
        self.open += 1
        self.served += 1
        self._changed.set()
        try:
            if self.hang is Hang.MID_STREAM:
                line = b'{"model":"gemma3:12b","response":"a","done":false}\n'
                writer.write(
                    b"HTTP/1.1 200 OK\r\nContent-Type: application/x-ndjson\r\n"
                    b"Transfer-Encoding: chunked\r\n\r\n"
                    + f"{len(line):x}\r\n".encode()
                    + line
                    + b"\r\n"
                )
                await writer.drain()
            # Never another byte: wait until the other side closes the connection.
            while await reader.read(65536):
                pass
        except ConnectionError:
            pass
        finally:
            self.open -= 1
            self._writers.discard(writer)
            self._changed.set()
            writer.close()
