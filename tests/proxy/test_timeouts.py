"""No upstream holds a request forever; an upstream that fails mid-stream is a failure event."""

from __future__ import annotations

import asyncio
import json
import logging

import aiohttp
import pytest

from gpugate.core.effects import EventKind
from gpugate.core.failures import FailureClass
from gpugate.core.residents import ResidentState
from tests.gate.harness import running_stack

TIMEOUTS = "timeouts: {connect: 1s, first_byte: 200ms, idle: 200ms, control: 2s}\n"
LOAD = {"model": "llama3.2:3b", "prompt": "hi"}
LISTING = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
FIRST_LINE = b'{"model":"llama3.2:3b","response":"a","done":false}\n'


class Hostile:
    """An upstream that lists nothing and then, on a load, goes silent, stalls or dies."""

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.server: asyncio.Server | None = None
        self.url = ""

    async def start(self) -> Hostile:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"
        return self

    async def close(self) -> None:
        assert self.server is not None
        self.server.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                _method, path = head.split(b" ", 2)[:2]
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":", 1)[1])
                await reader.readexactly(length)
                if path not in (b"/api/generate", b"/v1/chat/completions"):
                    body = b'{"models":[]}'
                    writer.write(LISTING % len(body) + body)
                    await writer.drain()
                    continue
                await self._load(reader, writer)
                return
        except (asyncio.IncompleteReadError, ConnectionError):
            return

    async def _load(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.mode != "silent":
            writer.write(
                b"HTTP/1.1 200 OK\r\nContent-Type: application/x-ndjson\r\n"
                b"Transfer-Encoding: chunked\r\n\r\n"
                + b"%x\r\n" % len(FIRST_LINE)
                + FIRST_LINE
                + b"\r\n"
            )
            await writer.drain()
        if self.mode == "dies":
            writer.transport.abort()
            self.closed.set_result(None)
            return
        await reader.read()  # until the gate closes the connection
        self.closed.set_result(None)


@pytest.fixture
async def hostile(request):
    server = await Hostile(request.param).start()
    yield server
    await server.close()


def settled(stack) -> None:
    core = stack.gate.core
    assert core.leases() == [] and core.waiting() == []
    assert [r for r in core.residents() if r.state is ResidentState.LOADING] == []


@pytest.mark.parametrize("hostile", ["silent"], indirect=True)
async def test_an_upstream_that_never_answers_is_a_timeout(
    tmp_path, sim_host, fakenvml_path, hostile
):
    async with (
        running_stack(
            tmp_path, sim_host, fakenvml_path, upstream=hostile.url, consumer_yaml=TIMEOUTS
        ) as stack,  # fmt: skip
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session,
    ):
        failure = stack.next_event(EventKind.FAILURE)
        async with session.post(stack.gate_url + "/api/generate", json=LOAD) as resp:
            assert resp.status == 504
            assert resp.headers["X-GPUGate-Failure"] == "TIMEOUT"
            body = json.loads(await resp.read())
        assert list(body) == ["error"] and body["error"].startswith("TIMEOUT")
        event = await asyncio.wait_for(failure, 5)
        assert event.failure.failure_class is FailureClass.TIMEOUT
        await asyncio.wait_for(hostile.closed, 5)
        settled(stack)


@pytest.mark.parametrize("hostile", ["silent"], indirect=True)
async def test_an_openai_client_gets_the_timeout_in_its_shape(
    tmp_path, sim_host, fakenvml_path, hostile
):
    async with (
        running_stack(
            tmp_path, sim_host, fakenvml_path, upstream=hostile.url, consumer_yaml=TIMEOUTS
        ) as stack,  # fmt: skip
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session,
    ):
        request = {"model": "llama3.2:3b", "messages": [{"role": "user", "content": "hi"}]}
        async with session.post(stack.gate_url + "/v1/chat/completions", json=request) as resp:
            assert resp.status == 504
            assert resp.headers["X-GPUGate-Failure"] == "TIMEOUT"
            error = json.loads(await resp.read())["error"]
        assert error["code"] == "TIMEOUT" and error["type"] == "api_error"
        await asyncio.wait_for(hostile.closed, 5)
        settled(stack)


@pytest.mark.parametrize(
    ("hostile", "failure_class"),
    [("stalls", FailureClass.TIMEOUT), ("dies", FailureClass.RUNTIME_CRASH)],
    indirect=["hostile"],
)
async def test_an_upstream_that_stops_mid_stream_cuts_the_client_off(
    tmp_path, sim_host, fakenvml_path, hostile, failure_class, caplog
):
    caplog.set_level(logging.DEBUG)
    async with (
        running_stack(
            tmp_path, sim_host, fakenvml_path, upstream=hostile.url, consumer_yaml=TIMEOUTS
        ) as stack,  # fmt: skip
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session,
    ):
        failure = stack.next_event(EventKind.FAILURE)
        async with session.post(stack.gate_url + "/api/generate", json=LOAD) as resp:
            assert resp.status == 200
            assert await resp.content.readline() == FIRST_LINE
            with pytest.raises(aiohttp.ClientPayloadError):
                await resp.content.read()
        event = await asyncio.wait_for(failure, 5)
        assert event.failure.failure_class is failure_class
        await asyncio.wait_for(hostile.closed, 5)
        settled(stack)
    assert [r for r in caplog.records if r.exc_info and r.levelno >= logging.INFO] == []
