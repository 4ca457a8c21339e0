"""The real whisper-server's connections behind the gate: every request goes up on a new
connection (the server leaves Nagle on, and a reused connection would also let a refused
body's rest be read as a request), and a client the gate keeps is told what
whisper-server tells a client it keeps (`Keep-Alive: timeout=5, max=100`)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from gpugate.config.model import UpstreamTimeouts
from gpugate.proxy.pool import UpstreamPool
from gpugate.runtimes.whisper.adapter import WhisperReading
from tests.whisper.conftest import Models
from tests.whisper.gated import Gated, gate_before
from tests.whisper.test_through_gate import transcribe
from tests.whisper.wire import Connection, request

BOUNDS = UpstreamTimeouts(connect=30.0, first_byte=30.0, idle=30.0)
HEALTH = request("GET", "/health")


@pytest.fixture
async def gated(
    whisper_server_binary, models: Models, tmp_path, sim_host, fakenvml_path
) -> AsyncIterator[Gated]:
    async with gate_before(
        whisper_server_binary, models, tmp_path, sim_host, fakenvml_path
    ) as gated:
        assert (await transcribe(gated.url))[0] == 200  # started
        yield gated


def kept_answers(port: int, count: int) -> list[tuple[int, str | None, str | None]]:
    """`count` GET /health on one connection: status, Keep-Alive, Connection of each."""
    with Connection(port) as conn:
        found = []
        for _ in range(count):
            answer = conn.exchange(HEALTH)
            found.append((answer.status, answer.header("Keep-Alive"), answer.header("Connection")))
        return found


async def test_a_client_the_gate_keeps_sees_whisper_servers_keep_alive(gated):
    direct = await asyncio.to_thread(kept_answers, gated.upstream, 3)
    assert direct == [(200, "timeout=5, max=100", None)] * 3
    assert await asyncio.to_thread(kept_answers, gated.port, 3) == direct


async def test_the_gates_pool_opens_a_connection_for_every_request_to_it(gated):
    pool = UpstreamPool("127.0.0.1", gated.upstream, keep_alive=WhisperReading.keep_alive)
    head = HEALTH.replace(b"\r\n\r\n", b"\r\nConnection: close\r\n\r\n")
    try:
        for _ in range(3):
            response = await pool.send(head, None, BOUNDS)
            body = await response.read(1000, 30.0)
            response.release()
            assert (response.status, body) == (200, b'{"status":"ok"}')
            assert response.header(b"connection") == b"close"
        assert (pool.opened, pool.idle) == (3, 0)
    finally:
        pool.close()
