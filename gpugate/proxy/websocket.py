"""WebSocket pass-through: an upgrade is relayed as a pair of websockets, frame by frame.

The gate opens the upstream websocket first (same path and query string, the client's
headers as the HTTP path sends them, the client's subprotocols offered), and only once the
upstream answered 101 does it accept the client's handshake, with the subprotocol the
upstream chose. An upstream that refuses the upgrade (an origin check's 403, a 404) is
answered to the client as that plain HTTP response: status, headers and body.

Frames go both ways as they are: text and binary, pings and pongs (neither side answers or
sends pings itself: the runtime decides; ComfyUI sends none), no size cap. Each direction
reads its next frame only after the previous one was handed to the other side's transport
and that transport drained below its high-water mark (aiohttp's WebSocketWriter waits on
the protocol's drain once its writes pass `writer_limit` while writing is paused), and a
side whose frames are not read has its socket's reading paused by aiohttp's frame queue.
So a client that does not read holds the gate at a few frames and a socket buffer, and
the upstream's own sends block, as they would with the client connected directly.

Closing: a close frame from one side is sent on to the other with the same code and
reason; the answer to it goes back. An upstream that vanishes without a close frame is a
RUNTIME_CRASH event and the client's connection is cut without one either, so the client
sees what it would see directly (an abnormal closure, 1006), never a code the runtime did
not send. A client that vanishes gets the upstream a 1001 (going away), as a browser
leaving the page sends. An open websocket has no idle timeout.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import hashlib
from collections.abc import Callable, Iterable
from typing import Any

import aiohttp
import attrs
from aiohttp import WSCloseCode, WSMsgType, hdrs, web
from aiohttp.http_websocket import WS_KEY, WebSocketReader, WebSocketWriter
from aiohttp.web_ws import WebSocketDataQueue
from multidict import CIMultiDict
from yarl import URL

from gpugate.config.model import UpstreamTimeouts
from gpugate.gate.gate import UPSTREAM_SKIP_AUTO_HEADERS
from gpugate.proxy.forward import HOP_BY_HOP, Stall, UpstreamTimeout, upstream_headers
from gpugate.proxy.request import Request, http_date
from gpugate.proxy.server import Connection

HANDSHAKE_HEADERS = (
    "Sec-WebSocket-Key",
    "Sec-WebSocket-Version",
    "Sec-WebSocket-Extensions",
    "Sec-WebSocket-Protocol",
    "Sec-WebSocket-Accept",
)
"""Each hop negotiates its own handshake; the client's are not sent upstream as such."""
REFUSAL_BODY_LIMIT = 1024 * 1024
"""The longest refusal body passed to the client; a longer one is cut."""
CLOSE_TIMEOUT = 5.0
"""How long a side has to answer a close frame before its connection is closed."""
SHUTDOWN_CLOSE = 1.0
"""How long a relay that is cancelled (shutdown, client gone) may spend closing both sides."""

QUEUE_LIMIT = 1 << 16
"""Bytes of frames read from the client and not yet relayed before its socket's reading
pauses (aiohttp's own queue limit)."""


def cut_off(request: Request) -> None:
    """End the client's connection now, without a close frame."""
    request.cut()


class ClientSocket(web.WebSocketResponse):
    """The client's side of the relay: aiohttp's websocket, over the listener's own
    connection (server.py) instead of aiohttp's server. Its reader and writer are
    aiohttp's (`WebSocketReader`, `WebSocketWriter`); the connection feeds the reader
    the bytes after the handshake and gives the writer its flow control."""

    def start(
        self, request: Request, protocol: str | None, extra_headers: Iterable[tuple[str, str]]
    ) -> None:
        """Write the 101 and switch the connection to frames."""
        conn = request.conn
        transport = conn.transport
        if transport is None:
            raise ConnectionResetError("the client's connection is closed")
        key = request.headers[hdrs.SEC_WEBSOCKET_KEY]
        accept = base64.b64encode(hashlib.sha1(key.encode() + WS_KEY).digest())
        head = [
            b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n"
            b"Connection: upgrade\r\nSec-WebSocket-Accept: %b\r\n" % accept
        ]
        if protocol:
            head.append(b"Sec-WebSocket-Protocol: %b\r\n" % protocol.encode("latin-1"))
        for name, value in extra_headers:
            head.append(b"%b: %b\r\n" % (name.encode(), value.encode("utf-8", "surrogateescape")))
        head.append(b"Date: %b\r\n\r\n" % http_date())
        request.close = True  # the connection is the websocket's from now on
        loop = asyncio.get_running_loop()
        self._loop = loop
        self._req = request  # type: ignore[assignment]  # what aiohttp closes: .transport
        self._payload_writer = _Drain(conn)  # type: ignore[assignment]
        self._ws_protocol = protocol
        self._writer = WebSocketWriter(conn, transport, limit=self._writer_limit)  # type: ignore[arg-type]
        self._reader = WebSocketDataQueue(conn, QUEUE_LIMIT, loop=loop)  # type: ignore[arg-type]
        self._parser = WebSocketReader(self._reader, 0, compress=False, decode_text=False)
        parser = self._parser
        conn.upgraded = lambda data: _feed(parser, conn, data)
        conn.on_eof = parser.feed_eof
        request.send(b"".join(head))


def _feed(parser: WebSocketReader, conn: Connection, data: bytes) -> None:
    eof, _ = parser.feed_data(data)
    if eof:
        conn.close()


class _Drain:
    """The one member of aiohttp's payload writer a websocket response uses."""

    def __init__(self, conn: Connection) -> None:
        self._conn = conn

    async def drain(self) -> None:
        await self._conn.drain()


Socket = ClientSocket | aiohttp.ClientWebSocketResponse


def is_upgrade(request: Request) -> bool:
    """A websocket handshake aiohttp can accept: GET, Upgrade: websocket, a valid key."""
    headers = request.headers
    if request.body.exists:
        # A handshake with a body is an ordinary request to Go's net/http and cpp-httplib
        # (their dialects serve it); aiohttp's parser refuses it before the gate sees it.
        return False
    if headers.get(hdrs.UPGRADE, "").strip().lower() != "websocket":
        return False
    if request.method != hdrs.METH_GET:
        return False
    tokens = {t.strip().lower() for t in headers.get(hdrs.CONNECTION, "").split(",")}
    if "upgrade" not in tokens or headers.get(hdrs.SEC_WEBSOCKET_VERSION) != "13":
        return False
    try:
        return len(base64.b64decode(headers.get(hdrs.SEC_WEBSOCKET_KEY, ""), validate=True)) == 16
    except binascii.Error:
        return False


@attrs.frozen
class Refusal:
    """The upstream's answer to a handshake it refused: its status line, headers (less the
    hops and its Content-Length) and body."""

    status: int
    reason: str
    headers: tuple[tuple[str, str], ...]
    body: bytes

    def write(self, request: Request, extra_headers: Iterable[tuple[str, str]]) -> None:
        """Write it to the client, framed by the gate."""
        parts = [b"HTTP/1.1 %d %b\r\n" % (self.status, self.reason.encode("latin-1"))]
        for name, value in (*self.headers, *extra_headers):
            parts.append(b"%b: %b\r\n" % (name.encode(), value.encode("utf-8", "surrogateescape")))
        if not request.keep_alive:
            parts.append(b"Connection: close\r\n")
            request.close = True
        parts.append(b"Content-Length: %d\r\n\r\n" % len(self.body))
        request.send(b"".join(parts) + self.body)


class UpgradeRefused(Exception):
    """The upstream answered the handshake with something other than 101."""

    def __init__(self, refusal: Refusal) -> None:
        super().__init__(f"upgrade refused with {refusal.status}")
        self.refusal = refusal


async def read_bounded(upstream: aiohttp.ClientResponse, limit: int, idle: float) -> bytes:
    """Up to `limit` bytes of a refusal's body, each chunk within `idle`."""
    chunks: list[bytes] = []
    size = 0
    while size < limit:
        try:
            async with asyncio.timeout(idle):
                chunk = await upstream.content.readany()
        except TimeoutError:
            raise UpstreamTimeout(Stall.IDLE, idle) from None
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks)


def downstream_headers(upstream: aiohttp.ClientResponse) -> CIMultiDict[str]:
    """A refusal's headers for the client: all but the hops."""
    connection = upstream.headers.get(hdrs.CONNECTION, "")
    drop = HOP_BY_HOP | {t.strip().lower() for t in connection.split(",") if t.strip()}
    return CIMultiDict((n, v) for n, v in upstream.headers.items() if n.lower() not in drop)


class UpstreamDropped(Exception):
    """The upstream's connection ended without a close frame."""


class WebSocketRelay:
    """Relays one listener's websocket upgrades to its upstream."""

    def __init__(self, base_url: str, upstream_host: str, timeouts: UpstreamTimeouts) -> None:
        self._base = base_url
        self._host = upstream_host
        self._timeouts = timeouts
        self._session: aiohttp.ClientSession | None = None

    def _client(self) -> aiohttp.ClientSession:
        # A session of its own: a refusal's body must be read before aiohttp's ws_connect
        # closes the response, which only a session's raise_for_status hook can do; and
        # an upgraded connection never returns to a pool anyway.
        if self._session is None:
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=self._timeouts.connect),
                auto_decompress=False,
                skip_auto_headers=UPSTREAM_SKIP_AUTO_HEADERS,
                raise_for_status=self._refused,
                connector=aiohttp.TCPConnector(limit=0, force_close=True),
            )
        return self._session

    async def close(self, _app: object = None) -> None:
        """Close the upstream session (an app's on_cleanup)."""
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def _refused(self, upstream: aiohttp.ClientResponse) -> None:
        if upstream.status == 101:
            return
        body = await read_bounded(upstream, REFUSAL_BODY_LIMIT, self._timeouts.idle)
        headers = downstream_headers(upstream)
        headers.popall(hdrs.CONTENT_LENGTH, None)
        raise UpgradeRefused(
            Refusal(upstream.status, upstream.reason or "", tuple(headers.items()), body)
        )

    async def relay(
        self,
        request: Request,
        *,
        drop: Iterable[str] = (),
        extra_headers: Iterable[tuple[str, str]] = (),
        on_drop: Callable[[BaseException], None] = lambda exc: None,
    ) -> None:
        """Relay one upgrade until either side closes.

        `drop`: request headers the runtime's reading already judged; `extra_headers`: added to the
        client's answer (101 or refusal). Raises UpstreamTimeout, or aiohttp.ClientError /
        OSError, when the upstream could not be reached; `on_drop` is told of an upstream
        that went away without a close frame once the websocket was open.
        """
        offered = [
            p.strip()
            for p in request.headers.get(hdrs.SEC_WEBSOCKET_PROTOCOL, "").split(",")
            if p.strip()
        ]
        headers = upstream_headers(request, self._host, drop=(*drop, *HANDSHAKE_HEADERS))
        try:
            upstream = await self._connect(request, headers, offered)
        except UpgradeRefused as exc:
            exc.refusal.write(request, extra_headers)
            return
        try:
            client = ClientSocket(
                timeout=CLOSE_TIMEOUT,
                autoclose=False,
                autoping=False,
                compress=False,
                max_msg_size=0,
                decode_text=False,
            )
            client.start(request, upstream.protocol, extra_headers)
            await self._pair(request, client, upstream, on_drop)
        finally:
            if not upstream.closed:
                with contextlib.suppress(Exception, asyncio.CancelledError):
                    async with asyncio.timeout(SHUTDOWN_CLOSE):
                        await upstream.close(code=WSCloseCode.GOING_AWAY)

    async def _connect(
        self, request: Request, headers: Any, offered: list[str]
    ) -> aiohttp.ClientWebSocketResponse:
        timeouts = self._timeouts
        bound = asyncio.timeout(timeouts.connect + timeouts.first_byte)
        try:
            async with bound:
                return await self._client().ws_connect(
                    URL(self._base + request.raw_path, encoded=True),
                    headers=headers,
                    protocols=offered,
                    timeout=aiohttp.ClientWSTimeout(ws_receive=None, ws_close=CLOSE_TIMEOUT),
                    autoclose=False,
                    autoping=False,
                    compress=0,
                    max_msg_size=0,
                    decode_text=False,
                )
        except aiohttp.ConnectionTimeoutError:
            raise UpstreamTimeout(Stall.CONNECT, timeouts.connect) from None
        except TimeoutError:
            if bound.expired():
                raise UpstreamTimeout(Stall.FIRST_BYTE, timeouts.first_byte) from None
            raise

    async def _pair(
        self,
        request: Request,
        client: ClientSocket,
        upstream: aiohttp.ClientWebSocketResponse,
        on_drop: Callable[[BaseException], None],
    ) -> None:
        down = asyncio.ensure_future(_pump(upstream, client))
        up = asyncio.ensure_future(_pump(client, upstream))
        try:
            await asyncio.wait((down, up), return_when=asyncio.FIRST_COMPLETED)
            try:
                async with asyncio.timeout(2 * CLOSE_TIMEOUT):
                    await _end(request, client, upstream, down, up, on_drop)
            except TimeoutError:
                # A side that takes a close frame this long is not reading: cut it.
                cut_off(request)
        except asyncio.CancelledError:
            # Shutdown, or aiohttp saw the client's connection go: both sides are told.
            with contextlib.suppress(Exception, asyncio.CancelledError):
                async with asyncio.timeout(SHUTDOWN_CLOSE):
                    await client.close(code=WSCloseCode.GOING_AWAY, drain=False)
            raise
        finally:
            for pump in (down, up):
                pump.cancel()
            await asyncio.gather(down, up, return_exceptions=True)


async def _end(
    request: Request,
    client: ClientSocket,
    upstream: aiohttp.ClientWebSocketResponse,
    down: asyncio.Future[aiohttp.WSMessage],
    up: asyncio.Future[aiohttp.WSMessage],
    on_drop: Callable[[BaseException], None],
) -> None:
    """Finish the pair once one direction ended: pass on the close, or the drop."""
    if down.done():
        msg, failed = _outcome(down)
        if msg is not None and msg.type is WSMsgType.CLOSE:
            code, reason = msg.data, msg.extra or ""
            await client.close(code=code, message=reason.encode())
            await upstream.close(code=code)
            return
        if failed is None:  # the upstream's connection ended without a close frame
            on_drop(UpstreamDropped("the upstream ended the websocket without a close frame"))
            cut_off(request)
            return
        # Writing to the client failed: the client is gone.
        await upstream.close(code=WSCloseCode.GOING_AWAY)
        return
    msg, failed = _outcome(up)
    if msg is not None and msg.type is WSMsgType.CLOSE:
        await upstream.close(code=msg.data, message=(msg.extra or "").encode())
        await client.close(code=upstream.close_code or msg.data)
        return
    if failed is None:  # the client's connection ended without a close frame
        await upstream.close(code=WSCloseCode.GOING_AWAY)
        return
    # Writing to the upstream failed: it is gone.
    on_drop(failed)
    cut_off(request)


def _outcome(
    pump: asyncio.Future[aiohttp.WSMessage],
) -> tuple[aiohttp.WSMessage | None, BaseException | None]:
    """What ended a pump: its source's last message, or the failure to write to its sink."""
    exc = pump.exception()
    if exc is None:
        return pump.result(), None
    if isinstance(exc, aiohttp.ClientError | OSError | RuntimeError):
        return None, exc
    raise exc


async def _pump(source: Socket, sink: Socket) -> aiohttp.WSMessage:
    """Relay frames from `source` to `sink` until `source` closes; returns what ended it.

    Each frame is written (and the sink's transport drained when it is over its
    high-water mark) before the next is read.
    """
    while True:
        msg = await source.receive()
        kind = msg.type
        if kind is WSMsgType.BINARY or kind is WSMsgType.TEXT:
            data = msg.data
            await sink.send_frame(data if isinstance(data, bytes) else data.encode(), kind)
        elif kind is WSMsgType.PING:
            await sink.ping(msg.data)
        elif kind is WSMsgType.PONG:
            await sink.pong(msg.data)
        else:
            return msg
