"""A small server-sent events reader for the tests (and nothing else)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import aiohttp


async def sse_messages(resp: aiohttp.ClientResponse) -> AsyncIterator[tuple[str, dict]]:
    """(event name, JSON data) for each message of an open stream."""
    kind, data = "message", []
    async for raw in resp.content:
        line = raw.decode().rstrip("\r\n")
        if not line:
            if data:
                yield kind, json.loads("\n".join(data))
            kind, data = "message", []
        elif line.startswith(":"):
            continue
        elif line.startswith("event:"):
            kind = line[6:].strip()
        elif line.startswith("data:"):
            data.append(line[5:].strip())
