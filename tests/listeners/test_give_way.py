"""Idle connections give way: one local program holding more connections than the open-files
limit allows cannot lock the others out. With the soft limit at 1,024 (as on most hosts) and
1,500 idle connections from 127.0.0.1, ordinary requests on fresh connections are served."""

from __future__ import annotations

import asyncio
import contextlib
import resource

import pytest

from gpugate_sim.ollama.server import SimOllama
from gpugate_sim.scenario import OllamaSpec
from tests.gate.harness import MODELS
from tests.listeners.serving import consumers_yaml, serving
from tests.listeners.wire import request
from tests.ports import free_ports

pytestmark = pytest.mark.e2e

FD_LIMIT = 1024
IDLE_CONNECTIONS = 1500
NORMAL_REQUESTS = 10
ANSWER_TIMEOUT = 60.0
"""Generous: the machine may be busy; a hang, not slowness, is what fails."""


def soft_limit() -> None:
    # Soft and hard: the gate raises its soft limit to the hard one at start.
    resource.setrlimit(resource.RLIMIT_NOFILE, (FD_LIMIT, FD_LIMIT))


@pytest.fixture
def room_for_idle_connections():
    """This process holds the idle connections: its own limit must allow them."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = IDLE_CONNECTIONS + 512
    if soft < wanted:
        if hard != resource.RLIM_INFINITY and hard < wanted:
            pytest.fail(f"the test needs {wanted} open files; the hard limit is {hard}")
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
    yield
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


async def test_idle_connections_from_one_address_give_way_to_new_requests(
    tmp_path, sim_host, subprocess_env, room_for_idle_connections
):
    sim = SimOllama(OllamaSpec(listen="127.0.0.1:0", models=MODELS), sim_host)
    upstream = await sim.start()
    control, listen = free_ports(2)
    config = tmp_path / "consumers.yaml"
    config.write_text(consumers_yaml(control, listen, upstream, reserve="1GiB", more=""))
    opened: list[asyncio.StreamWriter] = []
    try:
        with serving(config, subprocess_env, soft_limit) as served:

            async def idle() -> None:
                with contextlib.suppress(OSError, TimeoutError):
                    _, writer = await asyncio.wait_for(
                        asyncio.open_connection("127.0.0.1", listen), ANSWER_TIMEOUT
                    )
                    opened.append(writer)

            # Half of them have sent part of a head, half nothing at all.
            await asyncio.gather(*(idle() for _ in range(IDLE_CONNECTIONS)))
            for writer in opened[::2]:
                writer.write(b"GET /api/version HTTP/1.1\r\n")
            assert len(opened) > FD_LIMIT

            async def ordinary() -> int:
                reader, writer = await asyncio.wait_for(
                    asyncio.open_connection("127.0.0.1", listen), ANSWER_TIMEOUT
                )
                try:
                    writer.write(request("GET", "/api/version", Connection="close"))
                    answer = await asyncio.wait_for(reader.read(), ANSWER_TIMEOUT)
                    return int(answer.split(b" ", 2)[1]) if answer else 0
                finally:
                    writer.close()

            statuses = [await ordinary() for _ in range(NORMAL_REQUESTS)]
            assert statuses == [200] * NORMAL_REQUESTS
            assert served.process.poll() is None
        lines = served.stderr_lines()
        assert any(f"open files limit {FD_LIMIT}" in line for line in lines), lines
        assert not any("Traceback" in line for line in lines), lines
    finally:
        for writer in opened:
            writer.close()
        await sim.close()
