"""A small asyncio HTTP/1 server driven by any `HttpDialect`, for the differential corpora.

It does what a listener does with a dialect — reads heads and bodies by the dialect's rules,
writes its refusals and closes where it says — and hands each request to a handler that
returns the answer's status, headers and body. `echo` answers with what was read.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from email.utils import formatdate

import attrs

from gpugate.proxy.dialects.base import Framing, HttpDialect, Refusal, RequestHead

CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
BOOM = b"500 Internal Server Error\n\nServer got itself in trouble"


@attrs.frozen(slots=True)
class Answer:
    """What a handler answers; `close` as a handler error would (aiohttp's 500s)."""

    status: int
    headers: list[tuple[str, str]]
    body: bytes
    close: bool = False


Handler = Callable[[RequestHead, bytes], Answer]


def echo_text(method: str, target: str, version: tuple[int, int], headers, body: bytes) -> bytes:
    """The echo's deterministic body: what the server read, one field a line."""
    lines = [f"{method} {target} {version[0]}.{version[1]}"]
    lines += [f"{name}={value}" for name, value in headers]
    lines.append(f"body {len(body)} {body[:200]!r}")
    return "\n".join(lines).encode("utf-8", "backslashreplace")


def echo(head: RequestHead, body: bytes) -> Answer:
    """Answer 200 with the head and body as read; 404 where aiohttp's router matches no
    route (a target that is not a path: `*`, an authority)."""
    if not head.target.startswith("/") and "://" not in head.target:
        return Answer(404, [("Content-Type", "text/plain; charset=utf-8")], b"404: Not Found")
    if head.target.startswith("/boom"):
        # aiohttp's handle_error for a handler's unexpected exception: a closing 500.
        return Answer(500, [("Content-Type", "text/plain; charset=utf-8")], BOOM, close=True)
    text = echo_text(head.method, head.target, head.version, head.headers, body)
    return Answer(200, [("Content-Type", "text/plain; charset=utf-8")], text)


def http_date() -> bytes:
    return formatdate(usegmt=True).encode("ascii")


async def _read_body(
    dialect: HttpDialect, head: RequestHead, buf: bytes, reader: asyncio.StreamReader
) -> tuple[bytes, bytes, Refusal | None] | None:
    """The body and what follows it; None when the client left first."""
    if head.framing is Framing.LENGTH:
        while len(buf) < head.length:
            data = await reader.read(65536)
            if not data:
                return None
            buf += data
        return buf[: head.length], buf[head.length :], None
    if head.framing is Framing.UNTIL_CLOSE:
        while data := await reader.read(65536):
            buf += data
        return buf, b"", None
    if head.framing is Framing.CHUNKED:
        chunks = dialect.chunks()
        body = b""
        while True:
            got = chunks.feed(buf, http_date())
            body += got.data
            buf = buf[got.used :]
            if got.refusal is not None:
                return body, buf, got.refusal
            if got.done:
                return body, buf, None
            data = await reader.read(65536)
            if not data:
                return None
            buf += data
    return b"", buf, None


async def serve_connection(
    dialect: HttpDialect,
    handler: Handler,
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
) -> None:
    """Serve one connection until the dialect or the handler closes it or the client leaves."""
    buf = b""
    try:
        while True:
            result = dialect.read_head(buf, http_date())
            if result is None:
                data = await reader.read(65536)
                if not data:
                    if buf:
                        late = dialect.on_eof_mid_head(buf, http_date())
                        if late is not None:
                            writer.write(late.data)
                    return
                buf += data
                continue
            if isinstance(result, Refusal):
                writer.write(result.data)
                if result.close:
                    return
                buf = b""
                continue
            head = result
            buf = buf[head.size :]
            refuse_expect = getattr(dialect, "expectation_failed", None)
            failed = refuse_expect(head, http_date()) if refuse_expect else None
            if getattr(dialect, "defers_continue", False) and head.framing is not Framing.NONE:
                # Handlers read bodies themselves; a route that refuses never reads it
                # (and never invites it with 100 Continue).
                early = handler(head, b"")
                if early.status >= 400:
                    closes = dialect.closes_after(head, early.status, body_read=False)  # type: ignore[attr-defined]
                    said = dialect.says_close(head) or head.expect_continue  # type: ignore[attr-defined]
                    writer.write(_answer_head(dialect, head, early, said) + early.body)
                    if closes:
                        return
                    buf = b""
                    continue
            if failed is not None:
                writer.write(failed)
            elif head.expect_continue:
                writer.write(CONTINUE)
            read = await _read_body(dialect, head, buf, reader)
            if read is None:
                return
            body, buf, refusal = read
            if head.framing is Framing.UNTIL_CLOSE and not getattr(
                dialect, "answers_after_eof", True
            ):
                return
            if refusal is not None:
                writer.write(refusal.data)
                if refusal.close:
                    return
                buf = b""
                continue
            if failed is not None:
                continue
            answer = handler(head, body)
            close = answer.close or not head.keep_alive
            closes_after = getattr(dialect, "closes_after", None)
            if closes_after is not None:
                close = closes_after(head, answer.status, body_read=True)
            payload = b"" if head.method == "HEAD" else answer.body
            says_close = getattr(dialect, "says_close", None)
            said = says_close(head) or answer.close if says_close is not None else close
            writer.write(_answer_head(dialect, head, answer, said) + payload)
            await writer.drain()
            if close:
                return
    except ConnectionError:
        return
    finally:
        with contextlib.suppress(ConnectionError):
            await writer.drain()
        writer.close()


def _answer_head(dialect: HttpDialect, head: RequestHead, answer: Answer, close: bool) -> bytes:
    extra: dict[str, object] = {}
    names = dialect.answer_head.__code__.co_varnames
    if "version" in names:
        extra["version"] = head.version
    if "head" in names:
        extra["head"] = head.method == "HEAD"
    return dialect.answer_head(
        answer.status, answer.headers, http_date(), length=len(answer.body), close=close, **extra
    )


@contextlib.asynccontextmanager
async def running(dialect: HttpDialect, handler: Handler) -> AsyncIterator[int]:
    """A server on 127.0.0.1; yields its port."""

    open_connections: dict[asyncio.StreamWriter, asyncio.Event] = {}

    async def connected(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        done = open_connections[writer] = asyncio.Event()
        try:
            await serve_connection(dialect, handler, reader, writer)
        finally:
            done.set()

    server = await asyncio.start_server(connected, "127.0.0.1", 0)
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        server.close()
        await server.wait_closed()
        # A connection a case left waiting reads its end once its transport is closed.
        for writer, done in list(open_connections.items()):
            writer.close()
            await done.wait()
