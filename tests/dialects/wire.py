"""Raw exchanges for the dialect corpora, and an echo server driven by a dialect.

`exchange(address, data)` writes raw bytes to any host:port, half-closes, and returns every
byte answered: the same function reads the real server (the oracle), the echo server
below, or the gate in front of an oracle. `serve_echo` is a server whose reading and own
answers come only from a `HttpDialect`, with the oracle's echo handler written in Python.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import re
import socket
import threading
import time
import urllib.parse
from collections.abc import Iterator

import attrs

from gpugate.proxy.dialects.base import Framing, HttpDialect, Refusal, RequestHead
from gpugate.proxy.dialects.go import CONTINUE, TOO_LARGE
from gpugate.proxy.dialects.go_chunked import GoChunkReader
from gpugate.proxy.dialects.go_text import go_quote

EXCHANGE_TIMEOUT = 60.0
"""Generous: an answer never takes long, but the machine's two cores are shared."""

PROBE = b"GET /probe HTTP/1.1\r\nHost: probe\r\n\r\n"
"""Appended to a case to see whether the server still reads the connection after it."""

_DATE = re.compile(rb"\r\nDate: [^\r\n]*")


@attrs.frozen
class Outcome:
    """What a server answered to one case's bytes."""

    data: bytes
    """Every byte answered, `Date` values blanked."""
    ended: str
    """"closed" (at EOF, or reset when the server left bytes unread) or "open" (nothing
    more within the timeout)."""


def normalise(data: bytes) -> bytes:
    """Blank every `Date` value (the only field that differs between two runs)."""
    return _DATE.sub(b"\r\nDate: -", data)


def exchange(
    address: tuple[str, int],
    data: bytes,
    timeout: float = EXCHANGE_TIMEOUT,
    *,
    piece: int = 0,
) -> Outcome:
    """Send `data` on a fresh connection, half-close, read until the server closes.
    `piece`: send it in writes of that many bytes, paced, so that the server reads it cut
    where the network happens to cut it (any cut must read alike)."""
    sock = socket.create_connection(address, timeout=timeout)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def send() -> None:
        with contextlib.suppress(OSError):
            step = piece or len(data) or 1
            for start in range(0, len(data), step):
                sock.sendall(data[start : start + step])
                if piece:
                    time.sleep(0.0002)  # pacing only: no outcome waits on it
            sock.shutdown(socket.SHUT_WR)

    sender = threading.Thread(target=send, daemon=True)
    sender.start()
    chunks, ended = [], "closed"
    try:
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    except TimeoutError:
        ended = "open"
    except ConnectionResetError:
        pass
    finally:
        sender.join(timeout)
        sock.close()
    return Outcome(normalise(b"".join(chunks)), ended)


def _show(value: bytes) -> str:
    """main.go `show`."""
    if len(value) <= 64:
        return go_quote(value)
    return f"<{len(value)} bytes sha256:{hashlib.sha256(value).hexdigest()}>"


def go_header_map(head: RequestHead) -> dict[str, list[str]]:
    """`Request.Header` as net/http leaves it for a handler: Host moved out
    (server.go readRequest), Transfer-Encoding and Trailer taken as framing, one
    Content-Length (transfer.go readTransfer), Cache-Control from Pragma
    (request.go fixPragmaCacheControl)."""
    fields: dict[str, list[str]] = {}
    for key, value in head.headers:
        fields.setdefault(key, []).append(value)
    fields.pop("Host", None)
    fields.pop("Transfer-Encoding", None)
    lengths = fields.pop("Content-Length", [])
    if len(lengths) > 1:  # transfer.go fixLength: equal values become the first, trimmed
        lengths = [lengths[0].strip(" \t\r\n")]
    if lengths and head.framing is not Framing.CHUNKED:
        fields["Content-Length"] = lengths
    if head.framing is Framing.CHUNKED:
        fields.pop("Trailer", None)
    if fields.get("Pragma", [""])[0] == "no-cache" and "Cache-Control" not in fields:
        fields["Cache-Control"] = ["no-cache"]
    return fields


def _request_host(head: RequestHead) -> str:
    """`Request.Host`: the absolute target's authority, else the Host field."""
    target, host = head.target, ""
    if head.method == "CONNECT" and not target.startswith("/"):
        target = "http://" + target
    scheme, colon, rest = target.partition(":")
    if colon and scheme[:1].isalpha() and rest.startswith("//"):
        host = rest[2:].partition("/")[0].partition("?")[0].rpartition("@")[2]
        bracket = host.rfind("[")
        if bracket >= 0:
            # Go 1.26.0 url.parseHost: the IP-literal from the last "[", what comes
            # before it dropped
            close = host.rfind("]")
            host = "[" + host[bracket + 1 : close] + "]" + host[close + 1 :]
        host = _unescape(host)
    hosts = [v for k, v in head.headers if k == "Host"]
    return host or (hosts[0] if hosts else "")


def _unescape(host: str) -> str:
    """net/url keeps a URL's host unescaped."""
    return urllib.parse.unquote_to_bytes(host.encode("latin-1")).decode("latin-1")


def echo_body(head: RequestHead, body: bytes, error: str) -> bytes:
    """What tests/oracle/nethttp/main.go `echo` writes for this request."""
    latin = "latin-1"
    lines = [
        f"method {_show(head.method.encode(latin))}",
        f"target {_show(head.target.encode(latin))}",
        f'proto "HTTP/{head.version[0]}.{head.version[1]}"',
        f"host {go_quote(_request_host(head).encode(latin))}",
    ]
    fields = go_header_map(head)
    shown = 0
    for key in sorted(fields):
        for value in fields[key]:
            if shown < 12:
                lines.append(f"header {_show(key.encode(latin))}: {_show(value.encode(latin))}")
            shown += 1
    lines += [f"headers {shown}", f"body {_show(body)}"]
    if error:
        lines.append(f"error {go_quote(error.encode(latin))}")
    return ("\n".join(lines) + "\n").encode("utf-8", "surrogateescape")


def _date() -> bytes:
    from email.utils import formatdate

    return formatdate(usegmt=True).encode()


class _Conn:
    """One connection of the echo server: the dialect reads, the echo handler answers."""

    def __init__(
        self, dialect: HttpDialect, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ):
        self.dialect, self.reader, self.writer = dialect, reader, writer
        self.buffer, self.eof = b"", False

    async def more(self) -> bool:
        if self.eof:
            return False
        data = await self.reader.read(65536)
        self.eof = not data
        self.buffer += data
        return bool(data)

    async def run(self) -> None:
        first, last_method = True, ""
        while True:
            while not first and len(self.buffer) < 4 and await self.more():
                pass
            if not first and len(self.buffer) < 4:
                return  # server.go serve: Peek(4) before the next request, quiet at EOF
            skip = getattr(self.dialect, "skip_before_head", None)
            if skip is not None:
                self.buffer = self.buffer[skip(self.buffer, last_method) :]
            head = self.dialect.read_head(self.buffer, _date())
            while head is None:
                if not await self.more():
                    refusal = self.dialect.on_eof_mid_head(self.buffer, _date(), first=first)
                    if refusal is not None:
                        await self.refuse(refusal)
                    return
                head = self.dialect.read_head(self.buffer, _date())
            if isinstance(head, Refusal):
                await self.refuse(head)
                return
            self.buffer = self.buffer[head.size :]
            own = getattr(self.dialect, "own_answer", lambda *_: None)(head, _date())
            if own is not None:
                await self.refuse(own)
                if own.close:
                    return
                first, last_method = False, head.method
                continue
            body, error = await self.read_body(head)
            if head.target.partition("?")[0] == "/answer":
                if await self.answer(head):
                    return
                first, last_method = False, head.method
                continue
            text = echo_body(head, body, error)
            close = self.dialect.closes_after_body(head, len(body), error)  # type: ignore[attr-defined]
            answer = self.dialect.answer_head(
                200,
                [("Content-Type", "text/plain; charset=utf-8")],
                _date(),
                length=len(text),
                close=close,
                version=head.version,
                method=head.method,
            )
            self.writer.write(answer if head.method == "HEAD" else answer + text)
            await self.writer.drain()
            if close:
                return
            first, last_method = False, head.method

    async def answer(self, head: RequestHead) -> bool:
        """main.go `answer` through the dialect's `answer_head`; whether it closes."""
        query = urllib.parse.parse_qsl(head.target.partition("?")[2], keep_blank_values=True)
        values: dict[str, list[str]] = {}
        for key, value in query:
            values.setdefault(key, []).append(value)
        fields = [h.partition(":")[::2] for h in values.get("h", [])]
        fields = [(name, value.lstrip(" ")) for name, value in fields]
        status = int(values.get("status", ["200"])[0])
        body = values.get("body", [""])[0].encode("utf-8", "surrogateescape")
        chunked = values.get("chunked", [""])[0] == "1"
        bodiless = status < 200 or status in (204, 304) or head.method == "HEAD"
        close = not head.keep_alive or (chunked and head.version < (1, 1) and not bodiless)
        data = self.dialect.answer_head(
            status,
            fields,
            _date(),
            length=None if chunked else len(body),
            close=close,
            version=head.version,
            method=head.method,
        )
        if not bodiless and chunked and head.version >= (1, 1):
            data += (b"%x\r\n%s\r\n" % (len(body), body) if body else b"") + b"0\r\n\r\n"
        elif not bodiless:
            data += body
        self.writer.write(data)
        await self.writer.drain()
        return close

    async def read_body(self, head: RequestHead) -> tuple[bytes, str]:
        """The body as the handler reads it (io.ReadAll), and the error it ends in."""
        if head.expect_continue:
            self.writer.write(CONTINUE)
        if head.framing is Framing.LENGTH:
            while len(self.buffer) < head.length and await self.more():
                pass
            body, self.buffer = self.buffer[: head.length], self.buffer[head.length :]
            return body, "" if len(body) == head.length else "unexpected EOF"
        if head.framing is Framing.NONE:
            return b"", ""
        reader = self.dialect.chunks()
        body = bytearray()
        while True:
            chunks = reader.feed(self.buffer, _date())
            body += chunks.data
            self.buffer = self.buffer[chunks.used :]
            if chunks.done:
                return bytes(body), ""
            if chunks.error:
                return bytes(body), chunks.error
            if not await self.more():
                assert isinstance(reader, GoChunkReader)
                return bytes(body), reader.eof_error(self.buffer)

    async def refuse(self, refusal: Refusal) -> None:
        self.writer.write(refusal.data)
        await self.writer.drain()
        if refusal is TOO_LARGE:
            # server.go closeWriteAndWait: the write side first, the rest after 500 ms
            self.writer.write_eof()
            await asyncio.sleep(0.5)


async def _serve(dialect: HttpDialect, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
    try:
        await _Conn(dialect, reader, writer).run()
    except (ConnectionError, OSError):
        pass  # the client went first: nothing to answer
    except asyncio.CancelledError:
        pass  # the server stops
    finally:
        writer.close()


@contextlib.contextmanager
def serve_echo(dialect: HttpDialect) -> Iterator[tuple[str, int]]:
    """The echo server on a loop of its own thread; its address while the block runs."""
    loop = asyncio.new_event_loop()
    started: asyncio.Future[asyncio.Server] = loop.create_future()

    async def start() -> None:
        server = await asyncio.start_server(
            lambda r, w: _serve(dialect, r, w), "127.0.0.1", 0, limit=1 << 22
        )
        started.set_result(server)

    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    asyncio.run_coroutine_threadsafe(start(), loop).result(timeout=30)
    server = started.result()

    async def stop() -> None:
        server.close()
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    try:
        yield server.sockets[0].getsockname()[:2]
    finally:
        asyncio.run_coroutine_threadsafe(stop(), loop).result(timeout=30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=30)
        loop.close()
