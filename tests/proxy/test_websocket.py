"""WebSocket upgrades pass through the gate as a websocket pair: frames, pings, closes and
refusals as the upstream sends them, and a client that does not read holds the gate's
memory bounded while the upstream's own sends block."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import os
import struct
from pathlib import Path

import aiohttp
import pytest
from aiohttp import WSMsgType, web

from gpugate.core.effects import EventKind
from gpugate.core.failures import FailureClass
from tests.gate.harness import running_stack
from tests.listeners.serving import consumers_yaml, serving
from tests.ports import free_ports

PROTOCOL = "v2.gpugate.test"
CLOSE_REASON = "queue drained: réason"
MiB = 1024 * 1024


class Upstream:
    """A small websocket server: echo, streams, closes, drops and refusals."""

    def __init__(self) -> None:
        self.handshakes: list[web.Request] = []
        self.client_close: asyncio.Future[tuple[int, str]] = (
            asyncio.get_running_loop().create_future()
        )
        self.sent = 0
        self._progress = asyncio.Event()
        self.runner: web.AppRunner | None = None
        self.url = ""

    async def start(self) -> Upstream:
        app = web.Application()
        app.router.add_get("/ws", self.echo)
        app.router.add_get("/api/ws", self.echo)
        app.router.add_get("/stream", self.stream)
        app.router.add_get("/refuse", self.refuse)
        app.router.add_get("/api/ps", self.ps)
        self.runner = web.AppRunner(app, access_log=None)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://127.0.0.1:{port}"
        return self

    async def close(self) -> None:
        assert self.runner is not None
        await self.runner.cleanup()

    async def ps(self, request: web.Request) -> web.Response:
        return web.json_response({"models": []})

    async def progress(self) -> None:
        """Wait for the stream's next completed send."""
        self._progress.clear()
        await self._progress.wait()

    async def echo(self, request: web.Request) -> web.StreamResponse:
        self.handshakes.append(request)
        ws = web.WebSocketResponse(protocols=(PROTOCOL,), max_msg_size=0, autoclose=False)
        await ws.prepare(request)
        async for msg in ws:  # autoping: the upstream answers pings itself
            if msg.type is WSMsgType.TEXT and msg.data == "close please":
                await ws.close(code=4001, message=CLOSE_REASON.encode())
            elif msg.type is WSMsgType.TEXT and msg.data == "drop":
                assert request.transport is not None
                request.transport.abort()
            elif msg.type is WSMsgType.TEXT and msg.data == "query":
                await ws.send_str(request.raw_path)
            elif msg.type is WSMsgType.TEXT:
                await ws.send_str(msg.data)
            elif msg.type is WSMsgType.BINARY:
                await ws.send_bytes(msg.data)
        return ws

    async def stream(self, request: web.Request) -> web.StreamResponse:
        """`frames` binary frames of `size` bytes, each starting with its number."""
        frames = int(request.query["frames"])
        size = int(request.query["size"])
        ws = web.WebSocketResponse(max_msg_size=0)
        await ws.prepare(request)
        body = os.urandom(size - 4)
        for n in range(frames):
            await ws.send_bytes(struct.pack(">I", n) + body)
            self.sent += 1
            self._progress.set()
        await ws.close()
        return ws

    async def refuse(self, request: web.Request) -> web.Response:
        return web.Response(status=403, headers={"X-Why": "origin"})


class ClosingUpstream(Upstream):
    """Echo, and a client's close frame recorded and answered with 4003."""

    async def echo(self, request: web.Request) -> web.StreamResponse:
        self.handshakes.append(request)
        ws = web.WebSocketResponse(protocols=(PROTOCOL,), max_msg_size=0, autoclose=False)
        await ws.prepare(request)
        while True:
            msg = await ws.receive()
            if msg.type is WSMsgType.CLOSE:
                self.client_close.set_result((msg.data, msg.extra))
                await ws.close(code=4003, message=b"bye from upstream")
                return ws
            if msg.type in (WSMsgType.CLOSED, WSMsgType.ERROR):
                return ws
            if msg.type is WSMsgType.TEXT:
                await ws.send_str(msg.data)


@pytest.fixture
async def upstream():
    server = await ClosingUpstream().start()
    yield server
    await server.close()


@pytest.fixture
async def echo_upstream():
    server = await Upstream().start()
    yield server
    await server.close()


@contextlib.asynccontextmanager
async def gate_in_front(tmp_path, sim_host, fakenvml_path, server, consumer_yaml=""):
    async with running_stack(
        tmp_path, sim_host, fakenvml_path, upstream=server.url, consumer_yaml=consumer_yaml
    ) as stack:
        yield stack
        assert stack.gate.core.leases() == []
        assert stack.gate.core.waiting() == []


def ws_url(url: str, path: str) -> str:
    return url.replace("http://", "ws://") + path


async def test_text_and_binary_frames_pass_both_ways_byte_exact(
    tmp_path, sim_host, fakenvml_path, echo_upstream
):
    async with (
        gate_in_front(tmp_path, sim_host, fakenvml_path, echo_upstream) as stack,
        aiohttp.ClientSession() as session,
        session.ws_connect(
            ws_url(stack.gate_url, "/ws?clientId=abc%20d&x=%E2%9C%93&y"),
            protocols=("other", PROTOCOL),
            headers={"X-Custom": "kept"},
            max_msg_size=0,
        ) as ws,
    ):
        assert ws.protocol == PROTOCOL
        await ws.send_str("query")
        assert await ws.receive_str() == "/ws?clientId=abc%20d&x=%E2%9C%93&y"
        seen = echo_upstream.handshakes[-1]
        assert seen.headers["X-Custom"] == "kept"
        assert seen.headers["Host"] == echo_upstream.url.split("://")[1]
        await ws.send_str('{"type":"feature_flags","data":{"é":"\u2028"}}')
        assert await ws.receive_str() == '{"type":"feature_flags","data":{"é":"\u2028"}}'
        payload = bytes(range(256)) * 17
        await ws.send_bytes(payload)
        assert await ws.receive_bytes() == payload
        await ws.send_bytes(b"")
        assert await ws.receive_bytes() == b""
        big = os.urandom(20 * MiB)
        await ws.send_bytes(big)
        assert await ws.receive_bytes() == big


async def test_api_ws_path_and_server_initiated_frames(
    tmp_path, sim_host, fakenvml_path, echo_upstream
):
    async with (
        gate_in_front(tmp_path, sim_host, fakenvml_path, echo_upstream) as stack,
        aiohttp.ClientSession() as session,
    ):
        async with session.ws_connect(ws_url(stack.gate_url, "/api/ws?clientId=1")) as ws:
            await ws.send_str("query")
            assert await ws.receive_str() == "/api/ws?clientId=1"
        url = ws_url(stack.gate_url, "/stream?frames=50&size=65536")
        async with session.ws_connect(url) as ws:
            numbers = []
            async for msg in ws:
                assert msg.type is WSMsgType.BINARY and len(msg.data) == 65536
                numbers.append(struct.unpack(">I", msg.data[:4])[0])
            assert numbers == list(range(50))
            assert ws.close_code == 1000


async def test_a_ping_is_answered_by_the_upstreams_pong(
    tmp_path, sim_host, fakenvml_path, echo_upstream
):
    async with (
        gate_in_front(tmp_path, sim_host, fakenvml_path, echo_upstream) as stack,
        aiohttp.ClientSession() as session,
        session.ws_connect(ws_url(stack.gate_url, "/ws"), autoping=False) as ws,
    ):
        await ws.ping(b"are you there")
        msg = await ws.receive()
        assert msg.type is WSMsgType.PONG
        assert msg.data == b"are you there"


async def test_an_upstream_close_reaches_the_client_with_its_code_and_reason(
    tmp_path, sim_host, fakenvml_path, echo_upstream
):
    async with (
        gate_in_front(tmp_path, sim_host, fakenvml_path, echo_upstream) as stack,
        aiohttp.ClientSession() as session,
        session.ws_connect(ws_url(stack.gate_url, "/ws"), autoclose=False) as ws,
    ):
        await ws.send_str("close please")
        msg = await ws.receive()
        assert msg.type is WSMsgType.CLOSE
        assert (msg.data, msg.extra) == (4001, CLOSE_REASON)


async def test_a_client_close_reaches_the_upstream_and_its_answer_comes_back(
    tmp_path, sim_host, fakenvml_path, upstream
):
    async with (
        gate_in_front(tmp_path, sim_host, fakenvml_path, upstream) as stack,
        aiohttp.ClientSession() as session,
        session.ws_connect(ws_url(stack.gate_url, "/ws")) as ws,
    ):
        await ws.send_str("hello")
        assert await ws.receive_str() == "hello"
        await ws.close(code=4002, message=b"tab closed")
        assert await asyncio.wait_for(upstream.client_close, 5) == (4002, "tab closed")
        assert ws.close_code == 4003


async def test_an_upstream_that_drops_is_a_cut_connection_and_a_runtime_crash(
    tmp_path, sim_host, fakenvml_path, echo_upstream
):
    async with (
        gate_in_front(tmp_path, sim_host, fakenvml_path, echo_upstream) as stack,
        aiohttp.ClientSession() as session,
        session.ws_connect(ws_url(stack.gate_url, "/ws"), autoclose=False) as ws,
    ):
        failure = stack.next_event(EventKind.FAILURE)
        await ws.send_str("drop")
        msg = await ws.receive()
        # No close frame comes: the client sees the drop the upstream made.
        assert msg.type is WSMsgType.CLOSED
        assert ws.close_code == aiohttp.WSCloseCode.ABNORMAL_CLOSURE
        event = await asyncio.wait_for(failure, 5)
        assert event.failure is not None
        assert event.failure.failure_class is FailureClass.RUNTIME_CRASH


def upgrade_headers() -> dict[str, str]:
    return {
        "Upgrade": "websocket",
        "Connection": "Upgrade",
        "Sec-WebSocket-Version": "13",
        "Sec-WebSocket-Key": base64.b64encode(os.urandom(16)).decode(),
    }


@pytest.mark.parametrize(
    ("path", "status", "body", "header"),
    [("/refuse", 403, b"", ("X-Why", "origin")), ("/nowhere", 404, b"404: Not Found", None)],
)
async def test_a_refused_upgrade_is_passed_as_plain_http(
    tmp_path, sim_host, fakenvml_path, echo_upstream, path, status, body, header
):
    async with (
        gate_in_front(tmp_path, sim_host, fakenvml_path, echo_upstream) as stack,
        aiohttp.ClientSession() as session,
    ):
        async with session.get(stack.gate_url + path, headers=upgrade_headers()) as resp:
            assert resp.status == status
            assert await resp.read() == body
            assert resp.headers.get("Content-Length") == str(len(body))
            assert "Sec-WebSocket-Accept" not in resp.headers
            if header is not None:
                assert resp.headers[header[0]] == header[1]
        with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
            await session.ws_connect(ws_url(stack.gate_url, path))
        assert refused.value.status == status


async def test_the_listener_guard_does_not_cut_an_open_websocket(
    tmp_path, sim_host, fakenvml_path, echo_upstream
):
    limits = "limits: {header_timeout: 200ms, body_timeout: 200ms, idle_timeout: 200ms}\n"
    async with (
        gate_in_front(tmp_path, sim_host, fakenvml_path, echo_upstream, limits) as stack,
        aiohttp.ClientSession() as session,
        session.ws_connect(ws_url(stack.gate_url, "/ws")) as ws,
    ):
        await ws.send_str("before")
        assert await ws.receive_str() == "before"
        # Time passing is what is tested: well past every listener timeout, no frame sent.
        await asyncio.sleep(1.0)
        await ws.send_str("after")
        assert await ws.receive_str() == "after"


def vm_rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


async def test_a_client_that_does_not_read_holds_the_gate_memory_bounded(
    tmp_path, subprocess_env, echo_upstream
):
    """200 MiB of 1 MiB frames to a client that stops reading: the upstream blocks, the
    gate (`gpugate serve`, its own process) grows by a few frames at most."""
    control, listen = free_ports(2)
    config = tmp_path / "consumers.yaml"
    config.write_text(consumers_yaml(control, listen, echo_upstream.url, reserve="1GiB", more=""))
    frames = 200
    with contextlib.ExitStack() as stack:
        served = await asyncio.to_thread(stack.enter_context, serving(config, subprocess_env))
        pid = served.process.pid
        async with aiohttp.ClientSession() as session:
            url = f"ws://127.0.0.1:{listen}/stream?frames={frames}&size={MiB}"
            async with session.ws_connect(url, max_msg_size=0) as ws:
                first = await ws.receive_bytes()
                assert struct.unpack(">I", first[:4])[0] == 0
                before = vm_rss(pid)
                # The client reads nothing more; the upstream sends until its sends block.
                while True:
                    try:
                        await asyncio.wait_for(echo_upstream.progress(), 2.0)
                    except TimeoutError:
                        break
                blocked_at = echo_upstream.sent
                grown = vm_rss(pid) - before
                assert grown < 64 * MiB, f"grew {grown / MiB:.1f} MiB, {blocked_at} frames sent"
                assert blocked_at < frames // 2, blocked_at
                # Nothing was lost: once the client reads, every frame arrives in order.
                numbers = [1 + n for n in range(frames - 1)]
                got = []
                async for msg in ws:
                    assert len(msg.data) == MiB
                    got.append(struct.unpack(">I", msg.data[:4])[0])
                assert got == numbers
                assert echo_upstream.sent == frames


async def test_a_client_that_vanishes_gets_the_upstream_a_going_away(
    tmp_path, sim_host, fakenvml_path, upstream
):
    async with gate_in_front(tmp_path, sim_host, fakenvml_path, upstream) as stack:
        host, port = stack.gate_url.split("://")[1].split(":")
        reader, writer = await asyncio.open_connection(host, int(port))
        head = "".join(f"{k}: {v}\r\n" for k, v in upgrade_headers().items())
        writer.write(f"GET /ws HTTP/1.1\r\nHost: {host}:{port}\r\n{head}\r\n".encode())
        assert (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 101 ")
        writer.transport.abort()  # no close frame, no FIN: a reset
        assert await asyncio.wait_for(upstream.client_close, 5) == (1001, "")


async def test_an_upstream_that_never_answers_the_upgrade_is_a_504_timeout(
    tmp_path, sim_host, fakenvml_path
):
    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read()  # never answers; returns when the gate gives up

    server = await asyncio.start_server(silent, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    timeouts = "timeouts: {connect: 1s, first_byte: 200ms, idle: 200ms, control: 2s}\n"
    try:
        async with (
            running_stack(
                tmp_path, sim_host, fakenvml_path, upstream=url, consumer_yaml=timeouts
            ) as stack,
            aiohttp.ClientSession() as session,
        ):
            failure = stack.next_event(EventKind.FAILURE)
            async with session.get(stack.gate_url + "/ws", headers=upgrade_headers()) as resp:
                assert resp.status == 504
                assert resp.headers["X-GPUGate-Failure"] == "TIMEOUT"
                assert b"TIMEOUT" in await resp.read()
            event = await asyncio.wait_for(failure, 5)
            assert event.failure is not None
            assert event.failure.failure_class is FailureClass.TIMEOUT
            assert stack.gate.core.leases() == []
    finally:
        server.close()
