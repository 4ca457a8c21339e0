"""What a caller of the forwarding client reads: the upstream's `Response`, status and
headers at once and the body as it arrives, and the errors an exchange ends with (where it
stalled, the upstream gone or not speaking HTTP). Its connection is http1.py's."""

from __future__ import annotations

import asyncio
import collections
import enum
from typing import Protocol

from multidict import CIMultiDict


class Stall(enum.Enum):
    """Where an upstream exchange ran out of time."""

    CONNECT = "connecting"
    SLOT = "waiting for a free connection to the upstream"
    FIRST_BYTE = "waiting for response headers"
    IDLE = "waiting for the next chunk of the response"


class UpstreamTimeout(Exception):
    """An upstream call passed one of its bounds."""

    def __init__(self, stall: Stall, seconds: float) -> None:
        super().__init__(f"no progress {stall.value} for {seconds:g}s")
        self.stall = stall
        self.seconds = seconds


class UpstreamClosed(ConnectionError):
    """The upstream closed the connection before its answer was complete."""


class UpstreamInvalid(ConnectionError):
    """The upstream's answer is not HTTP/1.1 the parser accepts."""


class Keeper(Protocol):
    """What a response tells the keeper of its connection (pool.py) once its caller is done."""

    def give_back(self, connection: Carrier, reusable: bool) -> None:
        """The exchange on `connection` is over; keep it if `reusable`, else close it."""

    def slot_freed(self) -> None:
        """An exchange ended: its slot is free."""


class Carrier(Protocol):
    """What a response uses of the connection it arrives on (http1.py's `UpstreamConnection`)."""

    pool: Keeper
    response: Response | None
    reusable: bool

    def arm(self, seconds: float, stall: Stall) -> None: ...
    def resume(self) -> None: ...
    def close(self) -> None: ...


class Response:
    """An upstream's answer: status and headers at once, the body as it arrives."""

    __slots__ = (
        "_buffered",
        "_chunks",
        "_connection",
        "_ended",
        "_error",
        "_waiter",
        "announce",
        "content_length",
        "raw_headers",
        "reason",
        "status",
    )

    def __init__(self, connection: Carrier) -> None:
        self._connection = connection
        self.status = 0
        self.reason = ""
        self.raw_headers: list[tuple[bytes, bytes]] = []
        self.content_length: int | None = None
        self._chunks: collections.deque[bytes] = collections.deque()
        self._buffered = 0
        self._ended = False
        self._error: BaseException | None = None
        self._waiter: asyncio.Future[None] | None = None
        self.announce: bytes | None = None
        """The `Keep-Alive` value the runtime would have sent a client it keeps, where the
        gate's own `Connection: close` made it answer `Connection: close` (pool.py)."""

    def headers(self) -> CIMultiDict[str]:
        """The headers as a multidict (values decoded as aiohttp decodes them)."""
        return CIMultiDict(
            (name.decode("latin-1"), value.decode("utf-8", "surrogateescape"))
            for name, value in self.raw_headers
        )

    def header(self, name: bytes) -> bytes | None:
        """The last value of a header (`name` in lower case), or None."""
        found = None
        for key, value in self.raw_headers:
            if key.lower() == name:
                found = value
        return found

    @property
    def buffered(self) -> int:
        """Bytes of the body arrived and not yet taken."""
        return self._buffered

    @property
    def complete(self) -> bool:
        """The whole body arrived (it may still be buffered here)."""
        return self._ended

    async def chunk(self, idle: float) -> bytes:
        """What arrived of the body since the last call (b"" at its end), waiting at most
        `idle` seconds for something to arrive."""
        if not self._chunks:
            if self._ended:
                return b""
            if self._error is not None:
                raise self._error
            self._waiter = asyncio.get_running_loop().create_future()
            self._connection.arm(idle, Stall.IDLE)
            try:
                await self._waiter
            finally:
                self._waiter = None
            if not self._chunks:
                if self._error is not None:
                    raise self._error
                return b""
        chunks = self._chunks
        data = chunks.popleft() if len(chunks) == 1 else b"".join(chunks)
        chunks.clear()
        self._buffered = 0
        self._connection.resume()
        return data

    async def read(self, limit: int, idle: float) -> bytes:
        """Up to `limit` bytes of the body (all of it when shorter), each part within `idle`."""
        parts: list[bytes] = []
        size = 0
        while size < limit:
            part = await self.chunk(idle)
            if not part:
                break
            parts.append(part)
            size += len(part)
        return b"".join(parts)

    def release(self) -> None:
        """The caller is done: the connection is kept when the whole answer was read."""
        connection = self._connection
        if connection.response is not self:
            return
        connection.response = None
        whole = self._ended and not self._chunks
        connection.pool.give_back(connection, whole and connection.reusable)
        connection.pool.slot_freed()

    def close(self) -> None:
        """Abandon the exchange: the connection is closed, the upstream sees it go."""
        connection = self._connection
        if connection.response is not self:
            return
        connection.response = None
        connection.close()
        connection.pool.slot_freed()

    # -- from the connection ---------------------------------------------------------------

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _fail(self, error: BaseException) -> None:
        self._error = error
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_exception(error)
