"""Raw HTTP/1.1 over asyncio streams, for clients that misbehave on purpose."""

from __future__ import annotations

import asyncio
from urllib.parse import urlsplit

import attrs

READ_TIMEOUT = 10.0
"""Upper bound for one expected read; a hang fails the test instead of blocking the run."""


@attrs.frozen
class Reply:
    status: int
    headers: dict[str, str]
    body: bytes


async def connect(url: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    parts = urlsplit(url)
    assert parts.hostname is not None and parts.port is not None
    return await asyncio.open_connection(parts.hostname, parts.port)


def request(method: str, path: str, body: bytes = b"", **headers: str) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", "Host: localhost"]
    if body or method in ("POST", "PUT"):
        lines.append(f"Content-Length: {len(body)}")
    lines += [f"{name.replace('_', '-')}: {value}" for name, value in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


async def read_reply(reader: asyncio.StreamReader) -> Reply:
    """One response: status line, headers, and a Content-Length or chunked body."""
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), READ_TIMEOUT)
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in lines:
        if line:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
    if "content-length" in headers:
        size = int(headers["content-length"])
        body = await asyncio.wait_for(reader.readexactly(size), READ_TIMEOUT)
    elif headers.get("transfer-encoding") == "chunked":
        chunks = []
        while True:
            size = int(await asyncio.wait_for(reader.readline(), READ_TIMEOUT), 16)
            chunk = await asyncio.wait_for(reader.readexactly(size + 2), READ_TIMEOUT)
            if size == 0:
                break
            chunks.append(chunk[:-2])
        body = b"".join(chunks)
    else:
        body = await asyncio.wait_for(reader.read(), READ_TIMEOUT)
    return Reply(int(status_line.split()[1]), headers, body)


async def closed_by_peer(reader: asyncio.StreamReader) -> bytes:
    """Everything the peer sends until it closes (a reset counts as closed)."""
    received = b""
    try:
        while chunk := await asyncio.wait_for(reader.read(65536), READ_TIMEOUT):
            received += chunk
    except ConnectionResetError:
        pass
    return received


async def drip(writer: asyncio.StreamWriter, data: bytes, interval: float) -> None:
    """Send `data` one byte at a time (a slowloris client); stops when the peer closes."""
    try:
        for byte in data:
            writer.write(bytes([byte]))
            await writer.drain()
            await asyncio.sleep(interval)
    except (ConnectionResetError, BrokenPipeError):
        pass
