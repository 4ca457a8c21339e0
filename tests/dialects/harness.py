"""Raw exchanges with an HTTP server: send bytes as they are, read what comes back.

`exchange` writes a case's bytes to an address, reads until the connection closes or the
expected number of answers is complete, and then tells a kept connection from a closed one
by sending a probe request: a server that kept the connection answers it, one that closed
it does not. Date values, and the second a JSON answer says it was made in, are normalised
so two servers' answers compare byte for byte.
"""

from __future__ import annotations

import asyncio
import re

import attrs

PROBE = b"GET /probe HTTP/1.1\r\nHost: probe\r\n\r\n"
READ_SECONDS = 20.0
DATE = re.compile(rb"(?im)^(date: )[^\r\n]*")
NORMAL_DATE = b"Mon, 01 Jan 2001 00:00:00 GMT"
CREATED = re.compile(rb'("created":)(\d+)')
"""llama-server's `/v1/models` stamps each model with the second it answers in
(`std::time(0)`), as OpenAI-style answers do: two answers a second boundary apart differ
there and nowhere else."""


@attrs.frozen(slots=True)
class Case:
    """Raw bytes to send and how many answers (interim ones included) to wait for."""

    name: str
    data: bytes
    answers: int = 1
    half_close: bool = False
    """Half-close after sending: for unfinished requests, where no answer is due."""
    head: bool = False
    """The answers carry no body (a HEAD request)."""


@attrs.frozen(slots=True)
class Outcome:
    """What the server wrote, Date normalised, and whether it closed the connection."""

    data: bytes
    closed: bool
    stalled: bool = False
    """Neither closed nor answered within the read time: a server waiting for more."""


def normalise(data: bytes) -> bytes:
    """Every Date header's value replaced by one fixed date, every `"created"` stamp by
    zeros of its length (so a Content-Length still holds)."""
    data = DATE.sub(lambda m: m.group(1) + NORMAL_DATE, data)
    return CREATED.sub(lambda m: m.group(1) + b"0" * len(m.group(2)), data)


def complete_answers(data: bytes, *, head: bool = False) -> tuple[int, int]:
    """How many complete answers `data` starts with and where the last one ends; an
    answer with no length and no chunking runs to the close, so it never completes."""
    count = pos = 0
    while True:
        end = data.find(b"\r\n\r\n", pos)
        if end < 0:
            return count, pos
        lines = data[pos:end].split(b"\r\n")
        parts = lines[0].split(b" ", 2)
        status = int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else 0
        fields = {}
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            fields[name.strip().lower()] = value.strip()
        body = end + 4
        if status < 200 or status in (204, 304) or head:
            stop = body
        elif b"content-length" in fields:
            stop = body + int(fields[b"content-length"])
            if stop > len(data):
                return count, pos
        elif fields.get(b"transfer-encoding", b"").lower() == b"chunked":
            stop = _chunked_end(data, body)
            if stop < 0:
                return count, pos
        else:
            return count, pos
        count, pos = count + 1, stop


def _chunked_end(data: bytes, pos: int) -> int:
    while True:
        end = data.find(b"\r\n", pos)
        if end < 0:
            return -1
        size = int(data[pos:end].split(b";")[0], 16)
        pos = end + 2
        if size == 0:
            stop = data.find(b"\r\n\r\n", pos - 2)
            return -1 if stop < 0 else stop + 4
        pos += size + 2
        if pos > len(data):
            return -1


async def exchange(host: str, port: int, case: Case, *, seconds: float = READ_SECONDS) -> Outcome:
    """Send `case.data` to host:port and read the raw answer (module docstring)."""
    reader, writer = await asyncio.open_connection(host, port)
    try:
        writer.write(case.data)
        await writer.drain()
        if case.half_close:
            writer.write_eof()
        data = b""
        closed = stalled = False
        loop = asyncio.get_running_loop()
        deadline = loop.time() + seconds
        while complete_answers(data, head=case.head)[0] < case.answers:
            try:
                chunk = await asyncio.wait_for(reader.read(65536), deadline - loop.time())
            except TimeoutError:
                stalled = True
                break
            except ConnectionError:
                chunk = b""
            if not chunk:
                closed = True
                break
            data += chunk
        if not closed and not stalled and not case.half_close:
            closed = await _probe_closed(reader, writer, deadline)
        return Outcome(normalise(data), closed, stalled)
    finally:
        writer.close()


async def _probe_closed(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    deadline: float,
) -> bool:
    """Whether the server closed: it answers a probe on a kept connection."""
    loop = asyncio.get_running_loop()
    try:
        writer.write(PROBE)
        await writer.drain()
    except ConnectionError:
        return True
    extra = b""
    while True:
        try:
            chunk = await asyncio.wait_for(reader.read(65536), deadline - loop.time())
        except TimeoutError:
            return False
        except ConnectionError:
            return True
        if not chunk:
            # Bytes before the close were the server's own, not the probe's answer.
            return True
        extra += chunk
        if complete_answers(extra)[0] >= 1:
            return False
