"""Far more idle connections than the open-files limit allows: the gate keeps answering,
refuses the excess with a 503, and its log stays a few lines long."""

from __future__ import annotations

import asyncio
import contextlib
import resource

import aiohttp
import pytest

from gpugate_sim.ollama.server import SimOllama
from gpugate_sim.scenario import OllamaSpec
from tests.gate.harness import MODELS
from tests.listeners.serving import consumers_yaml, serving
from tests.listeners.wire import read_reply
from tests.ports import free_ports

pytestmark = pytest.mark.e2e

FD_LIMIT = 256
IDLE_CONNECTIONS = 400
NORMAL_REQUESTS = 20


def low_fd_limit() -> None:
    # Soft and hard: the gate raises its soft limit to the hard one at start.
    resource.setrlimit(resource.RLIMIT_NOFILE, (FD_LIMIT, FD_LIMIT))


async def until_answered(session: aiohttp.ClientSession, url: str, deadline: float) -> int:
    """Status of GET `url`, retrying a refusal (503 or no connection) until `deadline`."""
    loop = asyncio.get_running_loop()
    while True:
        try:
            async with session.get(url, timeout=aiohttp.ClientTimeout(total=3)) as resp:
                await resp.read()
                if resp.status != 503 or loop.time() > deadline:
                    return resp.status
        except (aiohttp.ClientError, TimeoutError):
            if loop.time() > deadline:
                raise
        await asyncio.sleep(0.2)  # a refused client backs off before it tries again


async def test_idle_connections_past_the_fd_limit_do_not_wedge_the_gate(
    tmp_path, sim_host, subprocess_env
):
    sim = SimOllama(OllamaSpec(listen="127.0.0.1:0", models=MODELS), sim_host)
    upstream = await sim.start()
    control, listen = free_ports(2)
    config = tmp_path / "consumers.yaml"
    limits = "    limits: {header_timeout: 1s}\n"
    config.write_text(consumers_yaml(control, listen, upstream, reserve="1GiB", more=limits))
    opened: list[asyncio.StreamWriter] = []
    try:
        with serving(config, subprocess_env, low_fd_limit) as served:
            loop = asyncio.get_running_loop()

            async def idle() -> asyncio.StreamReader | None:
                with contextlib.suppress(OSError, TimeoutError):
                    reader, writer = await asyncio.wait_for(
                        asyncio.open_connection("127.0.0.1", listen), 5
                    )
                    opened.append(writer)
                    return reader
                return None

            readers = await asyncio.gather(*(idle() for _ in range(IDLE_CONNECTIONS)))
            deadline = loop.time() + 15
            async with aiohttp.ClientSession() as session:
                statuses = await asyncio.gather(
                    *(
                        until_answered(session, f"http://127.0.0.1:{listen}/api/version", deadline)
                        for _ in range(NORMAL_REQUESTS)
                    )
                )
            assert statuses == [200] * NORMAL_REQUESTS

            # The connections past the cap were refused with the 503, not left hanging.
            async def status_of(reader: asyncio.StreamReader | None) -> int | None:
                if reader is None:
                    return None
                with contextlib.suppress(Exception):
                    async with asyncio.timeout(10):
                        return (await read_reply(reader)).status
                return None

            # All at once: a connection the gate still holds open must not cost its own wait.
            answers = await asyncio.gather(*(status_of(reader) for reader in readers))
            refused = answers.count(503)
            assert refused > 0
            assert served.process.poll() is None
        lines = served.stderr_lines()
        assert any(f"open files limit {FD_LIMIT}" in line for line in lines), lines
        assert len(lines) < 30, lines
        assert not any("Traceback" in line for line in lines), lines
    finally:
        for writer in opened:
            writer.close()
        await sim.close()
