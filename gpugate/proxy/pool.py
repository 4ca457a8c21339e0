"""The forwarding client's pool: keep-alive connections to one upstream, and the slots
that bound how many exchanges run at once.

A connection goes back to the pool only after a complete response the upstream agreed to
keep alive (http1.py says when). A runtime whose server closes connections on its own (an
idle timer, a request cap) gives its numbers (`KeepAlivePolicy`): a connection then
carries a request only well inside them, so the server never closes one a request is on
its way to, and one idle past its window is closed by the gate rather than left holding
whatever the server gives an open connection.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import AsyncIterable

from gpugate.config.model import UpstreamTimeouts as Bounds
from gpugate.proxy.http1 import ClientEnd, UpstreamConnection
from gpugate.proxy.http1_response import Response, Stall, UpstreamClosed, UpstreamTimeout
from gpugate.runtimes.keepalive import KEEP, NEVER, KeepAlivePolicy

MAX_IDLE = 256
"""Keep-alive connections kept per upstream; one more is closed when it comes back."""
SPARE_CONNECT = 5.0
"""Seconds a spare connection may take to open before it is given up."""
SWEEP_SLACK = 0.01
"""Seconds the idle sweep's timer may run late (a timer firing a hair early would
otherwise be set again at once, and again)."""


class UpstreamPool:
    """Keep-alive connections to one upstream `host:port`, reused as its server allows
    (`keep_alive`: the server's policy; True keeps them as long as they stay open, False
    opens one per request)."""

    def __init__(
        self, host: str, port: int, *, keep_alive: KeepAlivePolicy | bool = True, limit: int = 1024
    ) -> None:
        self.host = host
        self.port = port
        if isinstance(keep_alive, bool):
            keep_alive = KEEP if keep_alive else NEVER
        self.policy = keep_alive
        self.keep_alive = keep_alive.reuse
        self._reuse_within = keep_alive.reuse_within
        self._max_requests = keep_alive.max_requests
        self._max_idle = MAX_IDLE if keep_alive.max_idle is None else keep_alive.max_idle
        self.quick_ack = keep_alive.reuse and keep_alive.nagle
        """ACK the server's answers at once (its head and body come apart, Nagle on): a
        connection that carries a second request would wait for the delayed ACK."""
        self.announcement = None if keep_alive.reuse else keep_alive.announcement
        """The `Keep-Alive` value the server would send in place of the `Connection:
        close` every request of a pool that never reuses asks it for (Response.announce)."""
        self.limit = limit
        """Exchanges at once; one more waits for a slot, within the connect bound."""
        self.in_flight = 0
        self._slot_waiters: collections.deque[asyncio.Future[None]] = collections.deque()
        self._idle: list[UpstreamConnection] = []
        """Idle connections, the longest idle first (each goes to the end when it comes
        back, and the newest is taken)."""
        self._busy: set[UpstreamConnection] = set()
        self._sweep: asyncio.TimerHandle | None = None
        self.opened = 0
        """Connections opened since start (reuse shows as requests per connection)."""
        self._spare: asyncio.Future[None] | None = None
        self._spares = keep_alive.spare

    async def send(
        self, head: bytes, body: bytes | AsyncIterable[bytes] | None, bounds: Bounds, *,
        chunked: bool = False, head_only: bool = False, idempotent: bool = False,
        client: ClientEnd | None = None,
    ) -> Response:  # fmt: skip
        """Send one request (`head`: request line and headers, framing included) and
        return once the response headers arrived.

        `body` bytes go up in the same write as the head; an iterable is written as it
        yields, in chunks when `chunked` (the head says how it is framed). Raises
        UpstreamTimeout, or an OSError (UpstreamClosed, UpstreamInvalid, a refused
        connection) when there is no answer.
        A request that fails on a reused connection, closed before any byte of an answer
        came back, is sent once more on a new connection only when the server may act on
        it twice: its method is `idempotent` (RFC 9110 9.2.2) and its body is bytes held
        here, not a relayed stream. A POST is never sent twice: a server that read it and
        then crashed closes the connection exactly as one that never read it, so nothing
        says it was not acted on (Go's and aiohttp's clients follow the same rule). The
        benign cause, a server's idle timer closing the connection as the request goes
        out, cannot arise: a connection is reused only well inside the server's
        `KeepAlivePolicy`, and the request is written in the same step it is taken.
        """
        if self.in_flight < self.limit:
            self.in_flight += 1
        else:
            await self._wait_for_slot(bounds.connect)
        try:
            return await self._send(head, body, bounds, chunked, head_only, idempotent, client)
        except BaseException:
            self.slot_freed()
            raise

    async def _send(
        self, head: bytes, body: bytes | AsyncIterable[bytes] | None, bounds: Bounds,
        chunked: bool, head_only: bool, idempotent: bool, client: ClientEnd | None,
    ) -> Response:  # fmt: skip
        replayable = idempotent and not isinstance(body, AsyncIterable)
        while True:
            connection = self._take()
            reused = connection is not None
            if connection is None:
                connection = await self._connect(bounds.connect)
            self._busy.add(connection)
            try:
                response = await connection.exchange(head, body, bounds, chunked, head_only, client)
                response.announce = self.announcement
                return response
            except UpstreamClosed:
                connection.close()
                if reused and replayable and not connection.answered:
                    continue
                raise
            except BaseException:
                connection.close()
                raise

    async def _wait_for_slot(self, seconds: float) -> None:
        """Wait until an ending exchange hands its slot over (first come, first served)."""
        waiter = asyncio.get_running_loop().create_future()
        self._slot_waiters.append(waiter)
        try:
            async with asyncio.timeout(seconds):
                await waiter
        except BaseException as exc:
            if waiter.done() and not waiter.cancelled():
                self.slot_freed()  # handed over just as the wait ended: pass it on
            else:
                waiter.cancel()
                self._slot_waiters.remove(waiter)
            if isinstance(exc, TimeoutError):
                raise UpstreamTimeout(Stall.SLOT, seconds) from None
            raise

    def slot_freed(self) -> None:
        """An exchange ended: its slot goes to the first request waiting, if any."""
        while self._slot_waiters:
            waiter = self._slot_waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return
        self.in_flight -= 1

    def close(self) -> None:
        """Close every connection, idle or busy."""
        if self._spare is not None:
            self._spare.cancel()
            self._spare = None
        if self._sweep is not None:
            self._sweep.cancel()
            self._sweep = None
        for connection in [*self._idle, *self._busy]:
            connection.close()
        self._idle.clear()
        self._busy.clear()

    @property
    def idle(self) -> int:
        return len(self._idle)

    def _take(self) -> UpstreamConnection | None:
        idle = self._idle
        while idle:
            connection = idle.pop()
            transport = connection.transport
            if connection.lost or transport is None or transport.is_closing():
                connection.close()
                continue
            window = self._reuse_within
            if window is not None and connection.loop.time() - connection.idle_since >= window:
                # The newest idle connection is past its window, so is every older one.
                stale, self._idle = idle, []
                connection.close()
                for older in stale:
                    older.close()
                return None
            return connection
        return None

    def _sweep_idle(self) -> None:
        """Close the connections idle past their window (the server would keep each one
        a while longer, holding whatever it gives an open connection)."""
        self._sweep = None
        window = self._reuse_within
        idle = self._idle
        if window is None or not idle:
            return
        now = idle[0].loop.time()
        stale = 0
        while stale < len(idle) and now - idle[stale].idle_since >= window:
            stale += 1
        if stale:
            closing, self._idle = idle[:stale], idle[stale:]
            for connection in closing:
                connection.close()
        if self._idle:
            oldest = self._idle[0]
            at = max(oldest.idle_since + window, now + SWEEP_SLACK)
            self._sweep = oldest.loop.call_at(at, self._sweep_idle)

    async def _connect(self, seconds: float) -> UpstreamConnection:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(seconds):
                _, connection = await loop.create_connection(
                    lambda: UpstreamConnection(self), self.host, self.port
                )
        except TimeoutError:
            raise UpstreamTimeout(Stall.CONNECT, seconds) from None
        self.opened += 1
        connection.quick_ack = self.quick_ack
        connection.ends_streams = self.policy.ends_streams
        return connection

    def give_back(self, connection: UpstreamConnection, reusable: bool) -> None:
        """The exchange on `connection` is over: keep it idle if it may carry another."""
        self._busy.discard(connection)
        cap = self._max_requests
        if (
            reusable
            and self.keep_alive
            and not connection.lost
            and len(self._idle) < self._max_idle
            and (cap is None or connection.served < cap)
        ):
            self._keep_idle(connection)
        else:
            connection.close()
            if self._spares and self._spare is None and not self._idle:
                # The next request, likely soon, finds one the server accepted already.
                self._spare = asyncio.ensure_future(self._open_spare())

    def _keep_idle(self, connection: UpstreamConnection) -> None:
        loop = connection.loop
        connection.idle_since = loop.time()
        self._idle.append(connection)
        if self._reuse_within is not None and self._sweep is None:
            # One timer per pool, set again only when it fires: no timer per request.
            at = connection.idle_since + self._reuse_within
            self._sweep = loop.call_at(at, self._sweep_idle)

    async def _open_spare(self) -> None:
        """A connection opened ahead of the request that will need it, kept idle."""
        try:
            connection = await self._connect(SPARE_CONNECT)
        except (OSError, UpstreamTimeout):
            return  # the next request connects itself, and says what failed
        finally:
            self._spare = None
        if len(self._idle) < self._max_idle:
            self._keep_idle(connection)
        else:
            connection.close()

    def forget(self, connection: UpstreamConnection) -> None:
        """`connection` is closed: it is kept no longer."""
        self._busy.discard(connection)
        if connection in self._idle:
            self._idle.remove(connection)
