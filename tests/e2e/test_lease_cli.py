"""`gpugate lease` as a subprocess against `gpugate serve` on a simulated host."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import aiohttp
import pytest

from gpugate.commands.exits import Exit
from gpugate.core.units import GiB
from gpugate_sim.hostprocess import SimulatedHostProcess
from tests.control.sse import sse_messages
from tests.ports import free_ports
from tests.sim.processes import LineReader, kill_quietly, pid_exists

pytestmark = pytest.mark.e2e

TOKEN = "e2e-control-token"


def host_yaml(ollama_port: int) -> str:
    return textwrap.dedent(f"""\
        gpus:
          - {{name: NVIDIA GeForce RTX 4080, total: 16GiB, reserved: 434MiB}}
        ollama:
          listen: 127.0.0.1:{ollama_port}
          tokens_per_second: 2000
          keep_alive: 5m
          models:
            - {{name: 'gemma3:12b', size: 7796MiB, load_seconds: 0.05}}
            - {{name: 'bge-m3', size: 2012MiB, load_seconds: 0.05, embedding: true}}
        """)


def consumers_yaml(listen: int, control: int, upstream: int) -> str:
    return textwrap.dedent(f"""\
        gate:
          control: 127.0.0.1:{control}
          shutdown_grace: 2s
          control_tokens: [env:GPUGATE_CONTROL_TOKEN]
        budget:
          reserve: 1GiB
          reserve_max: 1GiB
          sample_interval: 100ms
          stale_after: 3s
          reclaim_timeout: 5s
        consumers:
          ollama:
            runtime: ollama
            listen: 127.0.0.1:{listen}
            upstream: http://127.0.0.1:{upstream}
            class: interactive
            residency: {{policy: keep_warm, ttl: 10m}}
            processes: {{commands: ["ollama serve"]}}
            models:
              gemma3:12b: {{envelope: 7796MiB}}
              bge-m3: {{class: background, envelope: 2012MiB}}
        """)


class Served:
    def __init__(self, gate_url: str, control: str, config: Path, env: dict[str, str]) -> None:
        self.gate_url = gate_url
        self.control = control
        self.config = config
        self.env = env

    def lease(self, *args: str, command: list[str], **popen) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [
                sys.executable,
                "-m",
                "gpugate",
                "lease",
                "--config",
                str(self.config),
                *args,
                "--",
                *command,
            ],
            env=self.env,
            text=True,
            **popen,
        )

    async def get(self, path: str):
        async with aiohttp.ClientSession() as session, session.get(self.control + path) as resp:
            assert resp.status == 200
            return await resp.text()

    async def status(self) -> dict:
        return json.loads(await self.get("/gate/v1/status"))

    async def events(self) -> list[dict]:
        return [json.loads(line) for line in (await self.get("/gate/v1/events")).splitlines()]


@pytest.fixture
def served(tmp_path):
    ollama_port, listen, control = free_ports(3)
    host_file = tmp_path / "host.yaml"
    host_file.write_text(host_yaml(ollama_port))
    config = tmp_path / "consumers.yaml"
    config.write_text(consumers_yaml(listen, control, ollama_port))
    with SimulatedHostProcess(host_file, tmp_path / "state") as host:
        assert host.environment is not None
        env = {**host.environment.apply(), "GPUGATE_CONTROL_TOKEN": TOKEN}
        env.pop("GPUGATE_TOKEN", None)
        gate = subprocess.Popen(
            [sys.executable, "-m", "gpugate", "serve", "--config", str(config)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        LineReader(gate.stderr)
        try:
            LineReader(gate.stdout).until("gpugate: ready")
            yield Served(f"http://127.0.0.1:{listen}", f"http://127.0.0.1:{control}", config, env)
        finally:
            if gate.poll() is None:
                gate.send_signal(signal.SIGTERM)
                gate.wait(timeout=30)


async def wait_exit(process: subprocess.Popen, timeout: float = 30) -> int:
    return await asyncio.to_thread(process.wait, timeout)


async def test_the_command_s_status_is_the_exit_status_and_no_lease_is_left(served):
    process = served.lease(
        "--consumer", "ollama", "--bytes", "1GiB", command=["sh", "-c", "exit 7"]
    )
    assert await wait_exit(process) == 7
    assert json.loads(await served.get("/gate/v1/leases")) == {"leases": []}
    assert (await served.status())["leases"] == []


async def test_the_command_sees_its_lease_in_the_status(served):
    script = (
        "import os, sys, urllib.request; "
        "print(os.environ['GPUGATE_LEASE']); "
        "print(urllib.request.urlopen(sys.argv[1]).read().decode())"
    )
    process = served.lease(
        "--consumer",
        "ollama",
        "--bytes",
        "3GiB",
        "--ttl",
        "2s",
        command=[sys.executable, "-c", script, served.control + "/gate/v1/status"],
        stdout=subprocess.PIPE,
    )
    out, _ = await asyncio.to_thread(process.communicate, timeout=30)
    assert process.returncode == 0
    lease_id, document = out.split("\n", 1)
    leases = json.loads(document)["leases"]
    assert [(x["id"], x["consumer"], x["pending"]) for x in leases] == [
        (int(lease_id), "ollama", 3 * GiB)
    ]
    assert (await served.status())["leases"] == []


async def test_a_lease_evicts_an_idle_lower_class_model(served):
    async with aiohttp.ClientSession() as session:
        for body, route in (
            ({"model": "gemma3:12b", "prompt": "x", "stream": False}, "/api/generate"),
            ({"model": "bge-m3", "input": "x"}, "/api/embed"),
        ):
            async with session.post(served.gate_url + route, json=body) as resp:
                assert resp.status == 200, await resp.text()
    resident = {r["model"] for r in (await served.status())["residents"]}
    assert resident == {"gemma3:12b", "bge-m3:latest"}
    # 5 GiB interactive fits only without the idle background bge-m3.
    process = served.lease(
        "--consumer", "ollama", "--bytes", "5GiB", "--wait", "20s", command=["true"]
    )
    assert await wait_exit(process) == 0
    events = await served.events()
    evicted = [e["model"] for e in events if e["event"] == "eviction_done"]
    assert evicted == ["bge-m3:latest"]
    granted = [e for e in events if e["event"] == "lease_granted" and e["bytes"] == 5 * GiB]
    assert len(granted) == 1
    assert {r["model"] for r in (await served.status())["residents"]} == {"gemma3:12b"}
    assert (await served.status())["leases"] == []


async def test_no_lease_is_exit_75_with_the_failure_class_on_one_line(served):
    process = served.lease(
        "--consumer",
        "ollama",
        "--bytes",
        "15GiB",
        "--wait",
        "1s",
        command=["sh", "-c", "echo ran"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    out, err = await asyncio.to_thread(process.communicate, timeout=30)
    assert process.returncode == Exit.TEMPFAIL
    assert out == ""
    assert err.startswith("gpugate lease: INSUFFICIENT_SCHEDULABLE_VRAM: ")
    assert err.count("\n") == 1
    assert (await served.status())["queue"] == []


async def test_a_signal_is_passed_on_and_the_lease_released(served):
    process = served.lease("--consumer", "ollama", "--bytes", "1GiB", command=["sleep", "60"])
    await until(served, lambda doc: len(doc["leases"]) == 1)
    process.send_signal(signal.SIGTERM)
    assert await wait_exit(process) == 128 + signal.SIGTERM
    assert (await served.status())["leases"] == []


async def test_sigkill_ends_the_command_too_and_the_lease_lapses_by_its_ttl(served):
    process = served.lease(
        "--consumer", "ollama", "--bytes", "1GiB", "--ttl", "2s", command=["sleep", "300"]
    )
    sleeper: int | None = None
    try:
        await until(served, lambda doc: len(doc["leases"]) == 1)
        sleeper = await only_child(process.pid, running="sleep")
        ended = pid_ended(sleeper)
        async with (
            aiohttp.ClientSession() as session,
            session.get(
                served.control + "/gate/v1/events?follow=1&failure=LEASE_TIMEOUT",
                timeout=aiohttp.ClientTimeout(total=None, sock_read=60),
            ) as stream,
        ):
            assert stream.status == 200
            process.kill()
            assert await wait_exit(process) == -signal.SIGKILL
            # The command went with it: its pidfd says so, with no lease left to cover it.
            await asyncio.wait_for(ended, 60)
            # And the lease, which nothing renews now, lapses by its ttl.
            kind, event = await asyncio.wait_for(anext(sse_messages(stream)), 60)
        assert (kind, event["event"], event["class"]) == ("event", "failure", "LEASE_TIMEOUT")
        status = await served.status()
        assert status["leases"] == [] and status["queue"] == []
    finally:
        kill_quietly(process)
        if sleeper is not None and pid_exists(sleeper):
            os.kill(sleeper, signal.SIGKILL)


async def only_child(pid: int, running: str, timeout: float = 60.0) -> int:
    """The one child of `pid`, once it runs the program `running`.

    The wrapper starts its command only after the gate's grant has reached it, which on a
    busy machine comes after the lease shows; and between fork and exec the child is still
    a copy of the wrapper (its comm `python`), so a child alone is not yet the command.
    """
    children = Path(f"/proc/{pid}/task/{pid}/children")
    deadline = time.monotonic() + timeout
    while True:
        found = children.read_text().split()
        assert len(found) <= 1, found
        if found and Path(f"/proc/{found[0]}/comm").read_text().strip() == running:
            return int(found[0])
        assert time.monotonic() < deadline, f"no child of {pid} running {running} in {timeout:g} s"
        await asyncio.sleep(0.05)


def pid_ended(pid: int) -> asyncio.Future[None]:
    """Resolved once the process `pid` has ended (its pidfd turns readable)."""
    loop = asyncio.get_running_loop()
    ended: asyncio.Future[None] = loop.create_future()
    fd = os.pidfd_open(pid)

    def readable() -> None:
        loop.remove_reader(fd)
        os.close(fd)
        if not ended.done():
            ended.set_result(None)

    loop.add_reader(fd, readable)
    return ended


async def until(served: Served, predicate, timeout: float = 20.0) -> None:
    """Poll the status document until `predicate` holds (a process outside the gate)."""
    deadline = time.monotonic() + timeout
    while not predicate(await served.status()):
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.05)


def test_the_wrapper_renews_by_the_ttl_each_renewal_answers():
    from gpugate.commands.lease import _renewed_ttl

    # A bound lowered by a reload shortens the ttl from a renewal on: renew by the new one.
    assert _renewed_ttl({"id": 3, "ttl": 60.0, "expires_in": 60.0}, 1800.0) == 60.0
    for answer in ({}, {"ttl": None}, {"ttl": "60"}, {"ttl": True}, {"ttl": 0.5}, [], None):
        assert _renewed_ttl(answer, 30.0) == 30.0
