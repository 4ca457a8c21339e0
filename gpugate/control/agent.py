"""The HAProxy agent-check responder (`gate.agent_check`).

HAProxy's `agent-check` connects to `agent-port`, sends its `agent-send` string (if any)
and reads one line. Per connection the gate reads at most one request line and answers
one line from `gpugate.control.capacity` (the numbers of `/gate/v1/capacity`), then closes:

* nothing sent (silence for `SILENCE` seconds, or an empty line): the host's answer;
* `MODEL`, optionally with `consumer=NAME` and `class=CLASS`: that model's answer;
* anything it cannot read (too long, not a question): the host's answer, logged once a
  minute.

A peer that leaves is no fault: HAProxy closes each check once it has its line, often with
a reset, and may reset one before the answer is written (uvloop then raises RuntimeError
for the write on a transport it closed, asyncio drops it). Such a check ends silently,
counted in `dropped`. Anything else that ends a check is logged once a minute with how many
more there were, in the gate's words, never the loop's own line.

Bounded: one line of at most `MAX_LINE` bytes read within `READ_TIMEOUT`, the answer
written within `WRITE_TIMEOUT` (and what the peer sends after it dropped for at most
`LINGER`, so that closing never resets the answer away), at most `MAX_CONNECTIONS` at
once (one more is closed unanswered: HAProxy keeps its last state when the agent does
not answer).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import TYPE_CHECKING

from gpugate.control.capacity import agent_answer
from gpugate.logs import OncePerInterval

if TYPE_CHECKING:
    from gpugate.config.model import Address
    from gpugate.gate.gate import Gate

log = logging.getLogger("gpugate.control.agent")

SILENCE = 0.25
"""Seconds without a byte after which the request is taken to be empty (the host's)."""
READ_TIMEOUT = 1.0
"""The most a request line may take to arrive."""
WRITE_TIMEOUT = 1.0
LINGER = 0.25
"""After the answer, how long what the peer still sends is read and dropped before closing
(closing with unread bytes would reset the connection, the answer with it)."""
MAX_LINE = 512
MAX_CONNECTIONS = 64


class AgentResponder:
    """Answers HAProxy agent checks for one gate on one address."""

    def __init__(
        self,
        gate: Gate,
        address: Address,
        *,
        silence: float = SILENCE,
        read_timeout: float = READ_TIMEOUT,
        write_timeout: float = WRITE_TIMEOUT,
        max_line: int = MAX_LINE,
        max_connections: int = MAX_CONNECTIONS,
    ) -> None:
        self.gate = gate
        self.address = address
        self.silence = silence
        self.read_timeout = read_timeout
        self.write_timeout = write_timeout
        self.max_line = max_line
        self.max_connections = max_connections
        self.active = 0
        self.answered = 0
        self.refused = 0
        """Connections closed unanswered because `max_connections` were open."""
        self.dropped = 0
        """Checks whose peer left (closed or reset) before it had its answer."""
        self.failed = 0
        """Checks ended by something unexpected (logged once a minute with a count)."""
        self.bound: tuple[str, int] = ("", 0)
        """The address listened on, once started."""
        self._server: asyncio.Server | None = None
        self._handlers: set[asyncio.Task[None]] = set()
        self._limiter = OncePerInterval(log, 60.0)

    async def start(self) -> tuple[str, int]:
        """Listen; returns the bound address. OSError when the address cannot be bound."""
        self._server = await asyncio.start_server(
            self._connected,
            self.address.host or None,
            self.address.port,
            reuse_address=True,
            limit=self.max_line + 2,
        )
        sockname = self._server.sockets[0].getsockname()
        self.bound = (str(sockname[0]), int(sockname[1]))
        return self.bound

    async def close(self) -> None:
        """Stop listening and end the connections being answered."""
        server, self._server = self._server, None
        if server is not None:
            server.close()
        for task in list(self._handlers):
            task.cancel()
        for task in list(self._handlers):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        if server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(server.wait_closed(), 1.0)

    async def _connected(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.active >= self.max_connections:
            self.refused += 1
            self._limiter.warning(
                "full",
                "agent-check: %d connections open already; one closed unanswered",
                self.active,
            )
            writer.transport.abort()
            return
        task = asyncio.current_task()
        if task is not None:
            self._handlers.add(task)
        self.active += 1
        answered = False
        try:
            line = await self._request(reader)
            answer = agent_answer(self.gate, line).line
            if writer.transport.is_closing():
                self.dropped += 1
                return
            writer.write(answer.encode("ascii") + b"\n")
            await asyncio.wait_for(writer.drain(), self.write_timeout)
            self.answered += 1
            answered = True
            await self._linger(reader, writer)
        except (OSError, TimeoutError, asyncio.IncompleteReadError):
            if not answered:
                self.dropped += 1
        except Exception as exc:
            if writer.transport.is_closing():
                # The peer left first: uvloop's write on the transport it closed.
                if not answered:
                    self.dropped += 1
            else:
                # Whatever a peer sends, the responder goes on answering the next one.
                self.failed += 1
                log.debug("agent-check: %r", exc)
                self._limiter.error(
                    "failed",
                    "agent-check: a check ended with an unexpected %s; the next are answered",
                    type(exc).__name__,
                )
        finally:
            self.active -= 1
            if task is not None:
                self._handlers.discard(task)
            writer.close()

    async def _request(self, reader: asyncio.StreamReader) -> str:
        """The request line: "" for silence or an empty line; "" for anything too long
        or not ASCII text (answered for the host, logged)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.read_timeout
        data = b""
        while b"\n" not in data and b"\r" not in data:
            left = deadline - loop.time()
            if left <= 0:
                break
            try:
                chunk = await asyncio.wait_for(
                    reader.read(self.max_line + 1 - len(data)), min(left, self.silence)
                )
            except TimeoutError:
                break
            if not chunk:
                break
            data += chunk
            if len(data) > self.max_line:
                self._unreadable(f"a request longer than {self.max_line} bytes")
                return ""
        line = data.replace(b"\r", b"\n").split(b"\n", 1)[0]
        try:
            text = line.decode("ascii")
        except UnicodeDecodeError:
            self._unreadable("a request that is not ASCII text")
            return ""
        text = text.replace("\t", " ")
        if not text.isprintable():
            self._unreadable("a request with control characters")
            return ""
        return text.strip()

    async def _linger(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Half-close, then drop what the peer still sends until it closes (HAProxy does at
        once) or LINGER is over."""
        if writer.transport.is_closing():
            return
        if writer.can_write_eof():
            writer.write_eof()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + LINGER
        while (left := deadline - loop.time()) > 0:
            try:
                if not await asyncio.wait_for(reader.read(4096), left):
                    return
            except TimeoutError:
                return

    def _unreadable(self, what: str) -> None:
        self._limiter.warning("unreadable", "agent-check: %s; answered for the host", what)
