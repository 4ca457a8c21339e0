"""A small blocking HTTP/1.1 client that times one request at a time on a kept-alive
connection: to the whole answer, and to its first body bytes (a stream's first token).

The benchmarks that compare a direct connection with proxies send one request after
another, so nothing here needs an event loop: a blocking socket and llhttp's parser
(`httptools`) cost the client less per request than aiohttp's, and that cost is in every
path's figure alike.

A connection the server closes (`Connection: close`, or whisper-server's keep-alive
limit) is opened again before the next request, outside the timed span.
"""

from __future__ import annotations

import select
import socket
import time
from urllib.parse import urlsplit

import attrs
import httptools

FIN_WAIT = 0.05
"""Seconds a client of a server that ends streams waits for its FIN after a stream."""


@attrs.frozen
class Timing:
    """One request's answer: its status and, in seconds from just before it was sent,
    when its first body bytes came and when it was complete."""

    status: int
    first_body: float
    complete: float
    body: bytes


@attrs.define
class _Reading:
    started: float
    status: int = 0
    first_body: float | None = None
    complete: float | None = None
    close: bool = False
    chunked: bool = False
    chunks: list[bytes] = attrs.field(factory=list)
    parser: httptools.HttpResponseParser | None = None

    def on_headers_complete(self) -> None:
        assert self.parser is not None
        self.status = self.parser.get_status_code()
        self.close = not self.parser.should_keep_alive()

    def on_header(self, name: bytes, value: bytes) -> None:
        if name.lower() == b"transfer-encoding" and b"chunked" in value.lower():
            self.chunked = True

    def on_body(self, data: bytes) -> None:
        if self.first_body is None and data:
            self.first_body = time.perf_counter()
        self.chunks.append(data)

    def on_message_complete(self) -> None:
        self.complete = time.perf_counter()


class Connection:
    """One kept-alive connection to `url`'s host and port."""

    def __init__(
        self,
        url: str,
        timeout: float = 60.0,
        *,
        quick_ack: bool = False,
        ends_streams: bool = False,
    ) -> None:
        parts = urlsplit(url)
        self.address = (parts.hostname or "127.0.0.1", parts.port or 80)
        self.host = f"{self.address[0]}:{self.address[1]}".encode()
        self.timeout = timeout
        self.quick_ack = quick_ack
        """ACK the answer as it arrives (TCP_QUICKACK after each request): a server that
        leaves Nagle on and writes head and body apart (whisper-server) would otherwise
        hold its body for this client's delayed ACK, 40 ms, on every reused connection."""
        self.ends_streams = ends_streams
        """The server may close the connection after a chunked answer that said keep-alive
        (llama-server does, a proxy in front of it need not): after one, the client waits
        up to `FIN_WAIT` for the server's FIN (outside the clock, else the next request
        races it), and a client whose connection was so closed opens the next one inside
        the next request's clock, as any client of that server pays for it."""
        self._reopen_timed = False
        self.sock: socket.socket | None = None

    def _open(self) -> socket.socket:
        if self.sock is not None and self._closed_by_peer(self.sock):
            self.close()
        if self.sock is None:
            self.sock = socket.create_connection(self.address, timeout=self.timeout)
            self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return self.sock

    @staticmethod
    def _ended_by_server(sock: socket.socket) -> bool:
        """Whether the server's FIN comes within FIN_WAIT."""
        ready, _, _ = select.select([sock], [], [], FIN_WAIT)
        if not ready:
            return False
        try:
            return sock.recv(1, socket.MSG_PEEK) == b""
        except OSError:
            return True

    @staticmethod
    def _closed_by_peer(sock: socket.socket) -> bool:
        """Whether the server closed the idle connection (its keep-alive timeout)."""
        ready, _, _ = select.select([sock], [], [], 0)
        if not ready:
            return False
        try:
            return sock.recv(1, socket.MSG_PEEK) == b""
        except OSError:
            return True

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None

    def head(self, method: str, path: str, body: bytes, content_type: str) -> bytes:
        """The request's head, as a client library would write it."""
        lines = [f"{method} {path} HTTP/1.1".encode(), b"Host: " + self.host, b"Accept: */*"]
        if body or method in ("POST", "PUT"):
            lines += [
                b"Content-Type: " + content_type.encode(),
                b"Content-Length: " + str(len(body)).encode(),
            ]
        return b"\r\n".join(lines) + b"\r\n\r\n"

    def request(
        self,
        method: str,
        path: str,
        body: bytes = b"",
        content_type: str = "application/json",
    ) -> Timing:
        """Send one request and read its whole answer; the clock starts at the send (at the
        connect, when the server ended the last connection after a stream)."""
        payload = self.head(method, path, body, content_type) + body
        started = time.perf_counter() if self._reopen_timed else None
        self._reopen_timed = False
        sock = self._open()
        reading = _Reading(time.perf_counter() if started is None else started)
        parser = httptools.HttpResponseParser(reading)
        reading.parser = parser
        sock.sendall(payload)
        if self.quick_ack:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_QUICKACK, 1)
        while reading.complete is None:
            data = sock.recv(65536)
            if not data:
                self.close()
                raise ConnectionError(f"{self.address}: closed before the answer ended")
            parser.feed_data(data)
        if reading.close:
            self.close()
        elif self.ends_streams and reading.chunked and self._ended_by_server(sock):
            self.close()
            self._reopen_timed = True
        # A body-less answer (a 204, a HEAD) has its first bytes when it is complete.
        first = reading.first_body if reading.first_body is not None else reading.complete
        return Timing(
            reading.status,
            first - reading.started,
            reading.complete - reading.started,
            b"".join(reading.chunks),
        )
