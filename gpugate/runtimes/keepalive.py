"""How long a runtime's HTTP server keeps a connection, and so how the gate may reuse one.

The forwarding client (proxy/pool.py) keeps connections to a runtime and sends the next
request on one that is idle. That is safe only while the server is sure to read it: a
server that closes an idle connection on its own timer can close it just as a request is
written, and a POST that then fails cannot be sent again (nothing says whether the server
read it). A runtime whose server closes connections on its own names the server's numbers
here; the gate reuses a connection only well inside them.
"""

from __future__ import annotations

import attrs

REUSE_FRACTION = 0.4
"""Of the server's idle timeout, how long the gate reuses an idle connection: the rest is
the margin for a request to reach the server before its timer can fire (2 s of
cpp-httplib's 5, so a gate whose loop stalls for less than 3 s still sends in time)."""


@attrs.frozen
class KeepAlivePolicy:
    """A runtime server's keep-alive, as the gate must respect it."""

    reuse: bool = True
    """Connections may be kept and reused at all (False: a new one per request, and the
    request says `Connection: close`)."""
    idle_timeout: float | None = None
    """Seconds the server keeps an idle connection open (None: longer than the gate keeps
    one)."""
    max_requests: int | None = None
    """Requests the server answers on one connection before it closes it (None: no cap)."""
    max_idle: int | None = None
    """Idle connections worth keeping open (None: the pool's own cap). A server that gives
    each open connection a worker thread while it waits for its next request has fewer
    left for new connections, the gate's own calls among them, for every idle one."""

    @property
    def pools_idle(self) -> bool:
        """Whether a client that keeps idle connections on a timer of its own (the gate's
        own calls: aiohttp keeps one 15 s) may keep them: only when the server keeps them
        until its client closes them."""
        return self.reuse and self.idle_timeout is None

    @property
    def reuse_within(self) -> float | None:
        """How long after its last answer a connection may carry another request (None: as
        long as it stays open)."""
        if self.idle_timeout is None:
            return None
        return self.idle_timeout * REUSE_FRACTION


KEEP = KeepAlivePolicy()
"""A server that keeps an idle connection until its client closes it (Go's net/http
without an IdleTimeout or ReadTimeout, as Ollama runs it)."""
NEVER = KeepAlivePolicy(reuse=False)
"""A new connection for every request."""

HTTPLIB = KeepAlivePolicy(idle_timeout=5.0, max_requests=100, max_idle=4)
"""cpp-httplib as whisper.cpp's server (v0.20.0) and llama-server (vendored in llama.cpp)
build it: `CPPHTTPLIB_KEEPALIVE_TIMEOUT_SECOND` 5 and `CPPHTTPLIB_KEEPALIVE_MAX_COUNT` 100,
neither changed by either server (the 100th answer says `Connection: close`). An idle
connection holds one of the server's worker threads in its keep-alive wait; whisper.cpp's
pool has 8 (`CPPHTTPLIB_THREAD_POOL_COUNT` on a machine of up to 9 cores), so the gate
keeps at most half of them idle."""
