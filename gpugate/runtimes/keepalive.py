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
    nagle: bool = False
    """The server leaves Nagle's algorithm on and writes an answer's head and its body in
    two writes (cpp-httplib built without `CPPHTTPLIB_TCP_NODELAY`). On a connection its
    client reuses, the body then waits for the client's delayed ACK of the head: 40 ms on
    Linux, on every answer but a new connection's first. A pool that reuses such a
    connection has its socket ACK at once (TCP_QUICKACK) once a request went up."""
    ends_streams: bool = False
    """The server ends the connection after every chunked answer, whatever its headers
    said: the pool never gives such a connection another request (one sent as the
    server's FIN is on its way would fail, and a POST is not sent twice)."""
    spare: bool = False
    """A pool left with no idle connection opens one at once, ahead of the request that
    will need it: the server's accept and its hand-off to a worker thread then happen
    before that request, not in its time (cpp-httplib: an accept loop that queues each
    connection to its thread pool). Measured on the real llama-server, whose every
    stream ends its connection: the gate's added time to the first token went from +2.9
    to +0.7 ms at the median (a loaded 2-core machine; docs/benchmarks.md). Not for
    whisper-server, whose one request per connection is as quick either way (+1.3 and
    +1.2 ms without, +1.3 and +0.8 with, `GET /health`, same machine): a spare would
    only hold one of its 8 worker threads."""
    announced: bool = False
    """The server tells a client how long it keeps the connection on every answer it
    does not close it with (cpp-httplib: `Keep-Alive: timeout=5, max=100`)."""

    @property
    def announcement(self) -> bytes | None:
        """The `Keep-Alive` value the server sends a client it keeps, or None."""
        if not self.announced or self.idle_timeout is None:
            return None
        value = b"timeout=%d" % self.idle_timeout
        return value if self.max_requests is None else value + b", max=%d" % self.max_requests

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

UVICORN = KeepAlivePolicy(idle_timeout=5.0)
"""uvicorn as vLLM runs it: an idle connection is closed 5 s after its last answer
(`timeout_keep_alive`, vllm/envs.py `VLLM_HTTP_TIMEOUT_KEEP_ALIVE`; uvicorn httptools_impl.py
`on_response_complete` arms `timeout_keep_alive_handler`), with no cap on requests
(`limit_max_requests` None) and no `Keep-Alive` header."""

HTTPLIB = KeepAlivePolicy(idle_timeout=5.0, max_requests=100, max_idle=4, announced=True)
"""cpp-httplib as whisper.cpp's server (v0.20.0) and llama-server (vendored in llama.cpp)
build it: `CPPHTTPLIB_KEEPALIVE_TIMEOUT_SECOND` 5 and `CPPHTTPLIB_KEEPALIVE_MAX_COUNT` 100,
neither changed by either server (the 100th answer says `Connection: close`; the others
`Keep-Alive: timeout=5, max=100`, httplib.h `Server::write_response_core`). An idle
connection holds one of the server's worker threads in its keep-alive wait; whisper.cpp's
pool has 8 (`CPPHTTPLIB_THREAD_POOL_COUNT` on a machine of up to 9 cores), so the gate
keeps at most half of them idle. llama.cpp builds its cpp-httplib with
`CPPHTTPLIB_TCP_NODELAY=1` (vendor/cpp-httplib/CMakeLists.txt): no Nagle stall."""
LLAMA_HTTPLIB = attrs.evolve(HTTPLIB, ends_streams=True, spare=True)
"""cpp-httplib as llama-server runs it: every streamed answer (server-http.cpp, the
`chunked_content_provider` returns `has_next`, false once it called `sink.done()`) is
taken by cpp-httplib as a cancelled write (httplib.cpp `write_content_chunked`:
`Error::Canceled`), and the connection is closed right after the last chunk, though
the answer said `Keep-Alive: timeout=5, max=100`. A router's every proxied answer is
such a stream (server-models.cpp `server_http_proxy`: its `next` reads the child's
answer). Measured on the real build: the FIN follows the terminating chunk within
0.1 ms, on every streamed completion."""
HTTPLIB_NAGLE = attrs.evolve(HTTPLIB, nagle=True)
"""cpp-httplib as whisper.cpp's server builds it: httplib.h included as it is, so
`CPPHTTPLIB_TCP_NODELAY` is false, and `write_response_core` writes the head (from a
`BufferStream`) and then the body. Measured on the real whisper-server on loopback, one
`GET /health` after another on one connection: 44 ms each (0.2 ms on a new connection,
0.05 ms on the reused one when the client ACKs at once)."""
