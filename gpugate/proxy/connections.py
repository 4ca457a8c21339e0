"""A listener's connections as a whole: its protocol factory, their timers and caps, making
room for a new connection, and the grace given to requests at shutdown.

No client can hold a listener for long or take all its slots. Each connection has one
timer, for the phase it is in (server_reading.py's `Phase`): the time to a request's complete
head (`header_timeout`), to the last byte of its body (`body_timeout`), and between two
requests (`idle_timeout`); a client that takes none of an answer for `send_timeout` loses
its connection (its request's lease goes with the cancelled handler).

Idle connections give way. A connection waiting for a request (between two, or one that
has sent nothing or only part of a head) holds no request, so when the listener is at its
cap, or the client's address at its own, or the process out of descriptors (an accept
that failed with EMFILE), the connection that has waited longest is closed to make room:
with the listener's 503 when it never had an answer, silently between requests (a client
sends its next request on a new connection, as nginx's reuse of idle connections makes it
do). On one host every local client comes from the same address, so a per-address cap
alone cannot tell a program holding a thousand idle connections from the one whose request
just came; the longest wait can. A connection is refused with the 503 only when every
other is busy with a request.
"""

from __future__ import annotations

import asyncio
import collections
import errno
import logging
import weakref

from gpugate.config.model import ListenerLimits
from gpugate.proxy.dialects.base import HttpDialect
from gpugate.proxy.server import Connection, Handler
from gpugate.proxy.server_reading import Phase, limited

log = logging.getLogger("gpugate.listener")

REFUSAL_BODY = b"gpugate: too many connections to this listener; try again later\n"
REFUSAL = (
    b"HTTP/1.1 503 Service Unavailable\r\n"
    b"Content-Type: text/plain; charset=utf-8\r\n"
    b"Content-Length: " + str(len(REFUSAL_BODY)).encode() + b"\r\n"
    b"Retry-After: 1\r\n"
    b"Connection: close\r\n"
    b"\r\n" + REFUSAL_BODY
)
REFUSAL_LINGER = 1.0
"""A refused connection reads (and drops) what the client sends for this long after the 503,
so the client reads the answer instead of a reset caused by its own unread request."""
REFUSAL_LINGER_SLOTS = 16
"""Refused connections lingering at once; past this a refusal is closed right after the 503."""
SHUTDOWN_MARGIN = 0.5
"""What cancelled handlers may take to end once the grace period is over."""
ROOM_ON_EMFILE = 16
"""Connections closed, longest waiting first, when an accept failed for want of descriptors."""

_servers: weakref.WeakSet[ListenerServer] = weakref.WeakSet()


class ListenerServer:
    """Protocol factory for one consumer listener: counts, caps and times its connections."""

    def __init__(
        self,
        handler: Handler,
        dialect: HttpDialect,
        limits: ListenerLimits,
        name: str,
        max_connections: int,
    ) -> None:
        self.handler = handler
        self.dialect = dialect
        self.limits = limits
        self.name = name
        self.max_connections = max_connections
        self.max_per_client = limits.per_client(max_connections)
        self.refusing = 0
        self.reclaimed = 0
        """Waiting connections closed to make room for new ones, since start."""
        self.stopping = False
        self._open: set[Connection] = set()
        self._waiting: dict[Connection, None] = {}
        """Connections with no request in hand, the longest waiting first."""
        self._per_client: collections.Counter[str] = collections.Counter()
        _servers.add(self)

    def __call__(self) -> Connection:
        return Connection(self)

    @property
    def open_connections(self) -> int:
        return len(self._open)

    # -- admission -------------------------------------------------------------------------

    def connected(self, conn: Connection) -> None:
        """A connection was accepted: admit it (making room) or refuse it with the 503."""
        client = conn.client
        if self.stopping or not self._room(client):
            conn.refused = True
            self._refuse(conn)
            return
        self._open.add(conn)
        self._per_client[client] += 1
        self._waiting[conn] = None
        arm(conn, self.limits.header_timeout, Phase.HEADERS)

    def _room(self, client: str) -> bool:
        if self._per_client[client] >= self.max_per_client:
            return self._reclaim(client)
        if len(self._open) >= self.max_connections:
            return self._reclaim(None)
        return True

    def _reclaim(self, client: str | None) -> bool:
        for conn in self._waiting:
            if client is None or conn.client == client:
                self.give_way(conn)
                return True
        return False

    def give_way(self, conn: Connection, *, refuse: bool = True) -> None:
        """Close a connection waiting for a request to make room for a new one."""
        self.reclaimed += 1
        self.disconnected(conn)
        transport = conn.transport
        if transport is None:
            return
        if refuse and conn.phase is Phase.HEADERS:
            # It never had an answer: it gets the listener's refusal, so a client that
            # sends a request on it later reads why instead of a reset.
            transport.write(REFUSAL)
        conn.refused = True
        transport.close()

    def make_room(self, count: int, *, refuse: bool = True) -> int:
        """Close up to `count` of the connections waiting longest; how many were closed."""
        closed = 0
        while closed < count and self._waiting:
            self.give_way(next(iter(self._waiting)), refuse=refuse)
            closed += 1
        return closed

    def _refuse(self, conn: Connection) -> None:
        transport = conn.transport
        assert transport is not None
        limited.warning(
            f"{self.name}:refused",
            "%s: refused a connection over max_connections (%d)",
            self.name,
            self.max_connections,
        )
        transport.write(REFUSAL)
        if self.refusing < REFUSAL_LINGER_SLOTS and transport.can_write_eof():
            self.refusing += 1
            conn.lingering = True
            transport.write_eof()
            conn.timer = asyncio.get_running_loop().call_later(REFUSAL_LINGER, transport.close)
        else:
            transport.close()

    def disconnected(self, conn: Connection) -> None:
        cancel(conn)
        stop_watching(conn)
        if conn in self._open:
            self._open.discard(conn)
            self._per_client[conn.client] -= 1
            if self._per_client[conn.client] <= 0:
                del self._per_client[conn.client]
            self._waiting.pop(conn, None)
        elif conn.lingering:
            conn.lingering = False
            self.refusing = max(0, self.refusing - 1)

    def lingering(self, conn: Connection, seconds: float) -> None:
        """The connection ends once `seconds` passed (server.py's `linger`)."""
        self._waiting.pop(conn, None)
        arm(conn, seconds, Phase.HANDLING)

    # -- phases ----------------------------------------------------------------------------

    def busy(self, conn: Connection) -> None:
        """The first bytes of a new request's head came on a waiting connection."""
        arm(conn, self.limits.header_timeout, Phase.HEADERS)

    def receiving(self, conn: Connection) -> None:
        """A head was read; its body has `body_timeout` to arrive."""
        self._waiting.pop(conn, None)
        arm(conn, self.limits.body_timeout, Phase.BODY)

    def handling(self, conn: Connection) -> None:
        """The request is whole: no timer while the handler answers."""
        self._waiting.pop(conn, None)
        conn.deadline = None

    def idle(self, conn: Connection) -> None:
        """The answer went down: the connection waits for the next request."""
        if conn in self._open:
            if self.stopping:
                conn.close()
                return
            self._waiting[conn] = None
            arm(conn, self.limits.idle_timeout, Phase.IDLE)

    # -- sending ---------------------------------------------------------------------------
    # The transport pauses the writer when the client has not taken the last 64 KiB; while
    # paused, the bytes it still holds are looked at every send_timeout: a client that took
    # none of them since the last look loses its connection (and its request its lease).

    def watch_sending(self, conn: Connection) -> None:
        transport = conn.transport
        if conn.send_timer is not None or transport is None:
            return
        conn.unsent = transport.get_write_buffer_size()
        conn.send_timer = asyncio.get_running_loop().call_later(
            self.limits.send_timeout, self._sending_check, conn
        )

    def stop_watching_sending(self, conn: Connection) -> None:
        stop_watching(conn)

    def _sending_check(self, conn: Connection) -> None:
        conn.send_timer = None
        transport = conn.transport
        if transport is None or transport.is_closing():
            return
        if transport.get_write_buffer_size() < conn.unsent:
            self.watch_sending(conn)  # it took some: look again later
            return
        limited.warning(
            f"{self.name}:send",
            "%s: dropped a connection whose client took nothing for %gs",
            self.name,
            self.limits.send_timeout,
        )
        # close() would wait for the unsent bytes to go; abort() ends it now, and the
        # connection's loss cancels its handler (which releases the request's lease).
        transport.abort()

    def expired(self, conn: Connection, phase: Phase) -> None:
        """A phase's timer ran out: the connection is closed (a handler is cancelled)."""
        if phase is Phase.HANDLING:  # a lingering close's end
            conn.close()
            return
        if phase is not Phase.IDLE:
            limit = self.limits.header_timeout
            if phase is Phase.BODY:
                limit = self.limits.body_timeout
            limited.warning(
                f"{self.name}:{phase.value}",
                "%s: dropped a connection whose request %s took longer than %gs",
                self.name,
                "headers" if phase is Phase.HEADERS else "body",
                limit,
            )
        conn.abort() if phase is Phase.BODY else conn.close()

    # -- shutdown --------------------------------------------------------------------------

    async def drain(self, grace: float) -> int:
        """Close the waiting connections; let requests in flight run for up to `grace`
        seconds, then cancel the rest. Returns how many were cancelled."""
        self.stopping = True
        self.make_room(len(self._waiting), refuse=False)
        running = {c.task for c in self._open if c.task is not None and not c.task.done()}
        if not running:
            return 0
        _, pending = await asyncio.wait(running, timeout=grace)
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.wait(pending, timeout=SHUTDOWN_MARGIN)
        return len(pending)

    def close_all(self) -> None:
        """Close every connection (after the drain)."""
        for conn in list(self._open):
            conn.abort()
        _servers.discard(self)


def out_of_files() -> int:
    """An accept failed for want of descriptors: close the connections waiting longest, in
    every listener, so the retried accept finds room. How many were closed."""
    closed = 0
    for server in list(_servers):
        closed += server.make_room(ROOM_ON_EMFILE)
    if closed:
        limited.warning(
            "out-of-files",
            "out of file descriptors: closed %d waiting connection(s) to accept new ones",
            closed,
        )
    return closed


OUT_OF_FILES = frozenset({errno.EMFILE, errno.ENFILE})


# -- one timer per connection, moved lazily ------------------------------------------------
# A phase sets its deadline, and the timer, when it fires before the deadline, is set again
# for it. A request whose head and body come at once so creates no timer while an earlier
# one is still pending.


def arm(conn: Connection, seconds: float, phase: Phase) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    conn.phase = phase
    conn.deadline = deadline
    if conn.timer is not None:
        if conn.timer_at <= deadline:
            return
        conn.timer.cancel()
    conn.timer_at = deadline
    conn.timer = loop.call_at(deadline, _expire, conn)


def cancel(conn: Connection) -> None:
    conn.deadline = None
    if conn.timer is not None:
        conn.timer.cancel()
        conn.timer = None


def stop_watching(conn: Connection) -> None:
    if conn.send_timer is not None:
        conn.send_timer.cancel()
        conn.send_timer = None


def _expire(conn: Connection) -> None:
    conn.timer = None
    deadline = conn.deadline
    if deadline is None:
        return
    loop = asyncio.get_running_loop()
    if loop.time() < deadline:
        conn.timer_at = deadline
        conn.timer = loop.call_at(deadline, _expire, conn)
        return
    conn.deadline = None
    conn.server.expired(conn, conn.phase)
