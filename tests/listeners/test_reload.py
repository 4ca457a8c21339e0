"""SIGHUP reloads consumers.yaml: an invalid file leaves the running configuration in force
and is logged as `gpugate check` prints it; a valid one is applied, and what needs a restart
is named."""

from __future__ import annotations

import asyncio
import io
import signal

import aiohttp
import pytest

from gpugate.commands.exits import Exit
from gpugate.config.check import run_check
from gpugate.core.units import GiB
from gpugate.runtimes.sections import RUNTIME_TABLE
from gpugate_sim.ollama.server import SimOllama
from gpugate_sim.scenario import OllamaSpec
from tests.gate.harness import MODELS
from tests.listeners.serving import consumers_yaml, serving
from tests.ports import free_ports

pytestmark = pytest.mark.e2e


async def reserve(session: aiohttp.ClientSession, control: int) -> int:
    async with session.get(f"http://127.0.0.1:{control}/gate/v1/status") as resp:
        return (await resp.json())["gpus"][0]["reserve"]


async def version(session: aiohttp.ClientSession, listen: int) -> int:
    async with session.get(f"http://127.0.0.1:{listen}/api/version") as resp:
        return resp.status


async def test_sighup_keeps_the_running_config_when_the_file_is_invalid_then_applies_a_valid_one(
    tmp_path, sim_host, subprocess_env
):
    sim = SimOllama(OllamaSpec(listen="127.0.0.1:0", models=MODELS), sim_host)
    upstream = await sim.start()
    control, listen, other = free_ports(3)
    config = tmp_path / "consumers.yaml"
    config.write_text(consumers_yaml(control, listen, upstream, reserve="1GiB", more=""))
    try:
        with serving(config, subprocess_env) as served:
            async with aiohttp.ClientSession() as session:
                assert await reserve(session, control) == GiB

                config.write_text(
                    consumers_yaml(control, listen, upstream, reserve="2GiB", more="")
                    + "    residency: {policy: sometimes}\n"
                )
                err = io.StringIO()
                assert run_check(config, io.StringIO(), err, runtimes=RUNTIME_TABLE) == Exit.CONFIG
                expected = err.getvalue().splitlines()
                assert expected
                served.process.send_signal(signal.SIGHUP)
                served.stderr.until("error gpugate.serve: reload:")
                for line in expected:
                    assert served.stderr.next() == f"error gpugate.serve: {line}"
                assert await reserve(session, control) == GiB
                assert await version(session, listen) == 200

                config.write_text(consumers_yaml(control, other, upstream, reserve="2GiB", more=""))
                served.process.send_signal(signal.SIGHUP)
                applied = served.stderr.until("info gpugate.serve: reload:")
                assert applied == f"info gpugate.serve: reload: configuration from {config} applied"
                restart = served.stderr.until("warning gpugate.serve: reload:")
                assert restart.endswith("only after a restart: consumers.ollama.listen")
                loop = asyncio.get_running_loop()
                deadline = loop.time() + 10
                while await reserve(session, control) != 2 * GiB:
                    assert loop.time() < deadline, "the new reserve was never applied"
                    await asyncio.sleep(0.1)  # the reserve shows from the next sample
                assert await version(session, listen) == 200  # still on the old port
            assert served.process.poll() is None
    finally:
        await sim.close()
