"""Raw HTTP/1.1 to a whisper-server (or the gate before one): requests written byte for byte,
answers read off the socket as they come, so framing, headers and the connection's end
are what the server wrote."""

from __future__ import annotations

import socket
from collections.abc import Iterable

import attrs

BOUNDARY = b"XyZzY"
TIMEOUT = 60.0


def part(
    name: bytes | str,
    value: bytes | str,
    *,
    boundary: bytes = BOUNDARY,
    headers: Iterable[bytes] = (),
    disposition: bytes | None = None,
) -> bytes:
    """One part, opened by its delimiter line, as curl -F writes it."""
    name = name.encode() if isinstance(name, str) else name
    value = value.encode() if isinstance(value, str) else value
    head = disposition if disposition is not None else b'form-data; name="' + name + b'"'
    lines = [b"Content-Disposition: " + head, *headers]
    return (
        b"--"
        + boundary
        + b"\r\n"
        + b"".join(h + b"\r\n" for h in lines)
        + b"\r\n"
        + value
        + b"\r\n"
    )


def form(*parts: bytes, boundary: bytes = BOUNDARY) -> bytes:
    """Parts and the closing delimiter."""
    return b"".join(parts) + b"--" + boundary + b"--\r\n"


def model_form(path: str | bytes, boundary: bytes = BOUNDARY) -> bytes:
    return form(part("model", path, boundary=boundary), boundary=boundary)


def form_type(boundary: bytes = BOUNDARY) -> bytes:
    return b"multipart/form-data; boundary=" + boundary


def request(
    method: str,
    path: str,
    body: bytes = b"",
    *,
    content_type: bytes | None = None,
    headers: Iterable[bytes] = (),
    length: bool = True,
) -> bytes:
    """A request's bytes: the line, Host, `headers`, Content-Type and Content-Length."""
    lines = [f"{method} {path} HTTP/1.1".encode(), b"Host: x", *headers]
    if content_type is not None:
        lines.append(b"Content-Type: " + content_type)
    if length and (body or method in ("POST", "PUT")):
        lines.append(b"Content-Length: %d" % len(body))
    return b"".join(line + b"\r\n" for line in lines) + b"\r\n" + body


@attrs.frozen
class Answer:
    status: int
    headers: tuple[tuple[str, str], ...]
    body: bytes

    def header(self, name: str) -> str | None:
        for key, value in self.headers:
            if key.lower() == name.lower():
                return value
        return None

    @property
    def said(self) -> tuple[int, bytes]:
        return self.status, self.body


class Connection:
    """One client connection; answers are read in order."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT)
        self.buffer = b""

    def __enter__(self) -> Connection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.sock.close()

    def send(self, raw: bytes) -> None:
        self.sock.sendall(raw)

    def _fill(self) -> bool:
        chunk = self.sock.recv(65536)
        self.buffer += chunk
        return bool(chunk)

    def answer(self, head_only: bool = False) -> Answer:
        """The next answer; AssertionError when the server closes before one."""
        while b"\r\n\r\n" not in self.buffer:
            assert self._fill(), f"closed before an answer (got {self.buffer[:200]!r})"
        head, self.buffer = self.buffer.split(b"\r\n\r\n", 1)
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split(" ", 2)[1])
        headers = tuple(tuple(line.split(": ", 1)) for line in lines[1:])
        answer = Answer(status, headers, b"")  # type: ignore[arg-type]
        length = 0 if head_only else int(answer.header("Content-Length") or 0)
        while len(self.buffer) < length:
            assert self._fill(), "closed inside a body"
        body, self.buffer = self.buffer[:length], self.buffer[length:]
        return attrs.evolve(answer, body=body)

    def exchange(self, raw: bytes, head_only: bool = False) -> Answer:
        self.send(raw)
        return self.answer(head_only)

    def closed(self) -> bool:
        """Whether the server closes the connection (waits for it, up to the timeout)."""
        if self.buffer:
            return False
        try:
            return self.sock.recv(1) == b""
        except ConnectionResetError:
            return True


def exchange(port: int, raw: bytes, head_only: bool = False) -> Answer:
    """One request on a new connection."""
    with Connection(port) as conn:
        return conn.exchange(raw, head_only)


def load(port: int, body: bytes, content_type: bytes | None = None, **kw: object) -> Answer:
    """POST /load with `body` (a form of BOUNDARY unless `content_type` says otherwise)."""
    ctype = form_type() if content_type is None else content_type
    return exchange(port, request("POST", "/load", body, content_type=ctype, **kw))  # type: ignore[arg-type]


def health(port: int) -> Answer:
    return exchange(port, request("GET", "/health"))
