"""A request as the listener's handler sees it (`Request`), its body as it arrives (`Body`),
and the way its answer goes down: the connection's (server.py) side a handler touches.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from email.utils import formatdate
from typing import Protocol
from urllib.parse import unquote

from multidict import CIMultiDict

from gpugate.proxy.dialects.base import (
    ContinueRule,
    HttpDialect,
    Refusal,
    RequestHead,
)

CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
BODY_BUFFER = 1 << 18
"""Body bytes held for a handler that has not taken them before the socket's reading pauses."""


class BodyTooLarge(Exception):
    """The body, as sent or as decoded, is over the consumer's body limit."""

    def __init__(self, size: int) -> None:
        super().__init__(size)
        self.size = size
        """Bytes it had when it passed the limit (its Content-Length, when it says)."""


class BodyBroken(Exception):
    """The body's chunked coding is malformed: the dialect's answer, and the connection ends."""

    def __init__(self, refusal: Refusal) -> None:
        super().__init__("malformed chunked body")
        self.refusal = refusal


class Link(Protocol):
    """What a request and its body use of their connection (server.py's `Connection`)."""

    transport: asyncio.Transport | None
    client: str
    writing_paused: bool

    @property
    def dialect(self) -> HttpDialect: ...
    async def drain(self) -> None: ...
    def pause_body(self) -> None: ...
    def resume_body(self) -> None: ...


_date_second = -1
_date_value = b""


def http_date() -> bytes:
    """The `Date` value for an answer written now (formatted once a second)."""
    global _date_second, _date_value
    now = time.time()
    second = int(now)
    if second != _date_second:
        _date_second = second
        _date_value = formatdate(now, usegmt=True).encode()
    return _date_value


class Body:
    """A request body as it arrives: read whole (`read`) or part by part (`parts`)."""

    __slots__ = (
        "_conn",
        "_error",
        "_parts",
        "_size",
        "_waiter",
        "done",
        "exists",
        "invite",
        "invite_on_read",
        "length",
    )

    def __init__(self, conn: Link, length: int | None, *, exists: bool) -> None:
        self._conn = conn
        self._parts: list[bytes] = []
        self._size = 0
        self._waiter: asyncio.Future[None] | None = None
        self._error: BaseException | None = None
        self.done = not exists
        """The last byte arrived (what is held may still be unread)."""
        self.length = length
        """The Content-Length, or None for a chunked body (and 0 for none)."""
        self.exists = exists
        self.invite = False
        """Send `100 Continue` when the handler first waits for the body (the client
        expects it, and no body byte came yet: `ContinueRule.BODY_PENDING`)."""
        self.invite_on_read = False
        """Send `100 Continue` when the handler first reads the body, whatever has come
        of it, unless its answer has begun (`ContinueRule.FIRST_READ`)."""

    def feed(self, data: bytes) -> None:
        if data:
            self._parts.append(data)
            self._size += len(data)
            if self._size > BODY_BUFFER:
                self._conn.pause_body()
            self._wake()

    def finish(self) -> None:
        self.done = True
        self._wake()

    def fail(self, exc: BaseException) -> None:
        if not self.done:
            self._error = exc
            self.done = True
        self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _take(self) -> bytes:
        parts = self._parts
        data = parts[0] if len(parts) == 1 else b"".join(parts)
        self._parts = []
        self._size = 0
        self._conn.resume_body()
        return data

    def expect(self, rule: ContinueRule, *, buffered: bool) -> None:
        """The request expects `100 Continue`: arrange it by the server's `rule`
        (`buffered`: some of the body came with the head)."""
        if rule is ContinueRule.FIRST_READ:
            self.invite_on_read = True
        elif rule is ContinueRule.BODY_PENDING and not buffered:
            self.invite = True

    def _invite(self) -> None:
        self.invite = self.invite_on_read = False
        transport = self._conn.transport
        if transport is not None and not transport.is_closing():
            transport.write(CONTINUE)

    def uninvite(self) -> None:
        """The answer begins: no `100 Continue` after it (Go's `disableWriteContinue`)."""
        self.invite = self.invite_on_read = False

    async def _wait(self) -> None:
        if self.invite:
            # The interim answer goes when the body is first waited for, so a request
            # answered without its body (a refused Host) is never invited to send it.
            self._invite()
        self._waiter = asyncio.get_running_loop().create_future()
        try:
            await self._waiter
        finally:
            self._waiter = None

    async def read(self, limit: int) -> bytes:
        """The whole body; BodyTooLarge past `limit` bytes, IncompleteReadError when the
        client's side ends first, BodyBroken for a malformed chunked coding."""
        if self.length is not None and self.length > limit:
            raise BodyTooLarge(self.length)
        if self.invite_on_read:
            self._invite()
        got: list[bytes] = []
        size = 0
        while True:
            if self._parts:
                part = self._take()
                size += len(part)
                if size > limit:
                    raise BodyTooLarge(size)
                got.append(part)
            if self.done and not self._parts:
                if self._error is not None:
                    raise self._error
                return got[0] if len(got) == 1 else b"".join(got)
            if not self._parts:
                await self._wait()

    async def next_part(self, stop: asyncio.Future[None] | None = None) -> bytes | None:
        """The next part as it arrives: b"" at the body's end, None once `stop` is done
        (the upstream answered before the body's end)."""
        if self.invite_on_read:
            self._invite()
        watched = False
        while True:
            if stop is not None and stop.done():
                return None
            if self._parts:
                return self._take()
            if self.done:
                if self._error is not None:
                    raise self._error
                return b""
            if stop is not None and not watched:
                watched = True
                stop.add_done_callback(lambda _: self._wake())
            await self._wait()

    async def parts(self) -> AsyncIterator[bytes]:
        """The body as it arrives, part by part (errors as `read` raises them)."""
        if self.invite_on_read:
            self._invite()
        while True:
            if self._parts:
                yield self._take()
                continue
            if self.done:
                if self._error is not None:
                    raise self._error
                return
            await self._wait()


class Request:
    """One request as the listener's handler sees it, and the way its answer goes down."""

    __slots__ = (
        "body",
        "close",
        "conn",
        "ended",
        "forwarded",
        "head",
        "headers",
        "method",
        "on_end",
        "path",
        "query",
        "raw_path",
        "remote",
        "started",
        "taken",
        "target",
        "version",
    )

    def __init__(self, conn: Link, head: RequestHead, body: Body) -> None:
        self.conn = conn
        self.head = head
        self.body = body
        self.method = head.method
        self.target = target = head.target
        self.version = head.version
        self.headers: CIMultiDict[str] = CIMultiDict(head.headers)
        self.remote = conn.client
        self.started = False
        """Some of the answer was written."""
        self.close = False
        """End the connection after this answer (the upstream said `Connection: close`)."""
        self.ended = False
        """The client half-closed after the request (`client_ended`)."""
        self.taken = False
        """Its handler has it (until then nothing of the gate's has run for it)."""
        self.forwarded = False
        """The request is going up to a runtime that is told of the client's half-close:
        before that (admission, a queue, a start) the client's end is its going."""
        self.on_end: Callable[[], None] | None = None
        """Told of the client's half-close: the upstream exchange passes it on."""
        if not target.startswith("/") and "://" in target:
            # absolute-form: what a runtime routes on is its path, after the authority
            # (which ends at the first "/" or "?": RFC 3986 3.2; Go's `url.Parse` and yarl
            # take no fragment from a request-target)
            rest = target.split("://", 1)[1]
            end = len(rest)
            for mark in "/?":
                found = rest.find(mark)
                if 0 <= found < end:
                    end = found
            target = rest[end:]
            if not target.startswith("/"):
                target = "/" + target
        self.raw_path = target
        """The target in origin form (an absolute-form target's path and query)."""
        path, _, self.query = target.partition("?")
        self.path = unquote(path) if "%" in path else path

    def before_handler(self) -> bytes | None:
        """What the server writes as the request reaches its handler: `100 Continue`
        where it does so then (`ContinueRule.DISPATCH`), and the answer it gives an
        `Expect` it does not know, keeping the connection (aiohttp's router's 417), which
        is returned for the caller to send instead of handling the request."""
        dialect = self.conn.dialect
        if self.head.expect_continue and dialect.continue_rule is ContinueRule.DISPATCH:
            transport = self.conn.transport
            if transport is not None and not transport.is_closing():
                transport.write(CONTINUE)
        check = dialect.expectation_failed
        if check is None:
            return None
        answer: bytes | None = check(self.head, http_date())
        return answer

    @property
    def keep_alive(self) -> bool:
        """Whether the connection stays open after this answer, as far as known now."""
        return self.head.keep_alive and not self.close

    @property
    def transport(self) -> asyncio.Transport | None:
        return self.conn.transport

    @property
    def dialect(self) -> HttpDialect:
        return self.conn.dialect

    def send(self, data: bytes) -> None:
        """Write to the client; ConnectionResetError when its side is gone."""
        transport = self.conn.transport
        if transport is None or transport.is_closing():
            raise ConnectionResetError("the client's connection is closed")
        if not self.started:
            self.started = True
            self.body.uninvite()
        transport.write(data)

    async def drain(self) -> None:
        """Wait while the client's transport holds more than its high-water mark."""
        if self.conn.writing_paused:
            await self.conn.drain()

    def client_ended(self) -> None:
        """The client half-closed once its request was whole, and its runtime's server
        answers such a client (`HttpDialect.answers_after_client_end`): the connection ends
        after the answer, and the upstream exchange is told (`on_end`)."""
        self.ended = True
        self.close = True
        if self.on_end is not None:
            self.on_end()

    def cut(self) -> None:
        """End the client's connection now: nothing marks a started answer complete."""
        self.close = True
        transport = self.conn.transport
        if transport is not None:
            transport.close()
