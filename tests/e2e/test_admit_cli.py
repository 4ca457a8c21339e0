"""`gpugate admit` as a subprocess against `gpugate serve` on a simulated host."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from gpugate.commands.exits import Exit
from gpugate.core.units import MiB
from gpugate_sim.hostprocess import SimulatedHostProcess
from gpugate_sim.whisper import SimWhisper, WhisperServerSpec
from tests.ports import free_ports
from tests.sim.processes import LineReader

pytestmark = pytest.mark.e2e

TOKEN = "e2e-control-token"
TURBO = "models/ggml-large-v3-turbo.bin"
WHISPER_BYTES = 2050 * MiB


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
            - {{name: 'qwen2.5-coder:7b', size: 6GiB, load_seconds: 0.05}}
        """)


def consumers_yaml(ports: dict[str, int]) -> str:
    return textwrap.dedent(f"""\
        gate:
          control: 127.0.0.1:{ports["control"]}
          shutdown_grace: 2s
          control_tokens: [env:GPUGATE_CONTROL_TOKEN]
        budget:
          reserve: 1GiB
          reserve_max: 1GiB
          sample_interval: 100ms
          stale_after: 3s
        consumers:
          ollama:
            runtime: ollama
            listen: 127.0.0.1:{ports["listen"]}
            upstream: http://127.0.0.1:{ports["ollama"]}
            class: production
            residency: {{policy: keep_warm, ttl: 10m}}
            processes: {{commands: ["ollama serve"]}}
            models:
              gemma3:12b: {{envelope: 7796MiB}}
              qwen2.5-coder:7b: {{envelope: 6GiB}}
          whisper:
            runtime: whisper
            listen: 127.0.0.1:{ports["whisper_listen"]}
            upstream: http://127.0.0.1:{ports["whisper"]}
            envelope: 2050MiB
            class: interactive
            control:
              command: [whisper-server, -m, {TURBO}]
              start_admission_timeout: 30s
            processes: {{commands: ["whisper-server"]}}
          never:
            runtime: whisper
            listen: 127.0.0.1:{ports["never_listen"]}
            upstream: http://127.0.0.1:{ports["never"]}
            envelope: 1GiB
            control:
              unit: never.service
              start_admission_timeout: 1s
            processes: {{commands: ["never-started-server"]}}
        """)


class Served:
    def __init__(self, ports: dict[str, int], config: Path, env: dict[str, str], state: Path):
        self.gate_url = f"http://127.0.0.1:{ports['listen']}"
        self.control = f"http://127.0.0.1:{ports['control']}"
        self.whisper_port = ports["whisper"]
        self.config = config
        self.env = env
        self.state = state

    async def admit(self, *args: str) -> tuple[int, str, str]:
        process = await asyncio.to_thread(
            subprocess.run,
            [sys.executable, "-m", "gpugate", "admit", *args, "--config", str(self.config)],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        return process.returncode, process.stdout, process.stderr

    async def get(self, path: str) -> str:
        async with aiohttp.ClientSession() as session, session.get(self.control + path) as resp:
            assert resp.status == 200
            return await resp.text()

    async def status(self) -> dict[str, Any]:
        return json.loads(await self.get("/gate/v1/status"))

    async def events(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in (await self.get("/gate/v1/events")).splitlines()]

    async def until(self, predicate: Callable[[dict[str, Any]], bool], timeout=20.0) -> None:
        """Poll the status document until `predicate` holds (a process outside the gate)."""
        deadline = time.monotonic() + timeout
        while not predicate(await self.status()):
            assert time.monotonic() < deadline, "condition not met in time"
            await asyncio.sleep(0.05)


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Served]:
    names = ("ollama", "listen", "control", "whisper", "whisper_listen", "never", "never_listen")
    ports = dict(zip(names, free_ports(len(names)), strict=True))
    host_file = tmp_path / "host.yaml"
    host_file.write_text(host_yaml(ports["ollama"]))
    config = tmp_path / "consumers.yaml"
    config.write_text(consumers_yaml(ports))
    state = tmp_path / "state"
    with SimulatedHostProcess(host_file, state) as host:
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
            yield Served(ports, config, env, state)
        finally:
            if gate.poll() is None:
                gate.send_signal(signal.SIGTERM)
                gate.wait(timeout=30)


def whisper_row(status: dict[str, Any], name: str = "whisper") -> dict[str, Any]:
    (gpu,) = status["gpus"]
    return gpu["consumers"][name]


async def test_admit_takes_a_start_lease_that_ends_once_whisper_holds_its_memory(served):
    code, out, err = await served.admit("whisper", "--wait", "10s")
    assert (code, err) == (0, "")
    assert out.startswith("gpugate admit: whisper: start lease ")
    status = await served.status()
    (lease,) = status["leases"]
    assert (lease["consumer"], lease["pending"]) == ("whisper", WHISPER_BYTES)
    (listed,) = json.loads(await served.get("/gate/v1/leases"))["leases"]
    assert (listed["id"], listed["purpose"], listed["ttl"]) == (lease["id"], "start", 30.0)

    spec = WhisperServerSpec(
        listen=f"127.0.0.1:{served.whisper_port}", model=TURBO, models={TURBO: WHISPER_BYTES}
    )
    with SimWhisper(spec, served.state):
        await served.until(lambda doc: doc["leases"] == [])
        status = await served.status()
        assert whisper_row(status)["observed"] == WHISPER_BYTES
        assert whisper_row(status)["committed"] == WHISPER_BYTES, "counted once, as observed"
    events = await served.events()
    released = [e for e in events if e["event"] == "lease_released" and e["consumer"] == "whisper"]
    assert [e["reason"] for e in released] == ["done"]
    assert not [e for e in events if e["event"] == "failure"]


async def test_a_second_admit_shares_the_start_lease_still_held(served):
    first = await served.admit("whisper")
    second = await served.admit("whisper")
    assert (first[0], second[0]) == (0, 0)
    assert len((await served.status())["leases"]) == 1
    assert first[1].split(" for ")[0] == second[1].split(" for ")[0]


async def test_admit_fails_with_75_and_the_class_when_higher_classes_fill_the_card(served):
    async with aiohttp.ClientSession() as session:
        for model in ("gemma3:12b", "qwen2.5-coder:7b"):
            body = {"model": model, "prompt": "x", "stream": False}
            async with session.post(served.gate_url + "/api/generate", json=body) as resp:
                assert resp.status == 200, await resp.text()

    code, out, err = await served.admit("whisper", "--wait", "1s")

    assert (code, out) == (Exit.TEMPFAIL, "")
    # The production residents stay for their 10m ttl, beyond the 1s wait.
    assert err.startswith("gpugate admit: DEADLINE_CANNOT_BE_MET: lease-")
    assert err.count("\n") == 1
    status = await served.status()
    assert status["leases"] == [] and status["queue"] == []
    assert {r["model"] for r in status["residents"]} == {"gemma3:12b", "qwen2.5-coder:7b"}


async def test_a_start_lease_never_materialised_is_released_after_its_timeout(served):
    code, _, err = await served.admit("never")
    assert (code, err) == (0, "")
    admitted = time.monotonic()
    await served.until(lambda doc: doc["leases"] == [], timeout=5.0)
    assert time.monotonic() - admitted >= 0.9
    events = [e for e in await served.events() if e.get("consumer") == "never"]
    failures = [e for e in events if e["event"] == "failure"]
    assert [e["class"] for e in failures] == ["LEASE_TIMEOUT"]
    released = [e for e in events if e["event"] == "lease_released"]
    assert [e["reason"] for e in released] == ["expired"]


async def test_admit_of_an_unknown_consumer_names_the_configured_ones(served):
    code, _, err = await served.admit("nobody")
    assert code == Exit.DATAERR  # a name the gate does not know: retrying cannot help
    assert err == (
        "gpugate admit: BAD_REQUEST: consumer: no consumer 'nobody' "
        "(configured: ollama, whisper, never)\n"
    )


async def test_admit_while_whisper_runs_leases_none_of_what_it_holds(served):
    # whisper-server started by hand, holding its model: an admit (an operator's, or a
    # unit's ExecStartPre) must not lease its 2 GiB a second time, nor evict for them.
    spec = WhisperServerSpec(
        listen=f"127.0.0.1:{served.whisper_port}", model=TURBO, models={TURBO: WHISPER_BYTES}
    )
    with SimWhisper(spec, served.state):
        await served.until(lambda doc: whisper_row(doc)["observed"] == WHISPER_BYTES)
        code, out, err = await served.admit("whisper", "--wait", "10s")
        assert (code, err) == (0, "")
        assert out.startswith("gpugate admit: whisper: start lease ")
        # The start lease may already have ended (whisper holds its memory): its grant is
        # read from the events, not from the leases still held.
        await served.until(lambda doc: doc["leases"] == [])
        assert whisper_row(await served.status())["committed"] == WHISPER_BYTES
    events = await served.events()
    (grant,) = [e for e in events if e["event"] == "lease_granted" and e["consumer"] == "whisper"]
    assert grant["bytes"] <= 1024**2
    assert not [e for e in events if e["event"] in ("eviction_started", "failure")]


async def test_admit_then_exec_becomes_the_command_in_the_same_process(served, tmp_path):
    marker = tmp_path / "ran"
    script = (
        f"import os, pathlib, sys; pathlib.Path({str(marker)!r}).write_text(str(os.getpid())); "
        "sys.exit(7)"
    )
    argv = [sys.executable, "-m", "gpugate", "admit", "whisper", "--wait", "10s",
            "--config", str(served.config), "--", sys.executable, "-c", script]  # fmt: skip
    child = subprocess.Popen(argv, env=served.env, stdout=subprocess.PIPE, text=True)
    out, _ = await asyncio.to_thread(child.communicate, timeout=60)
    # The command's status is the process's: the unit's main PID never changed.
    assert child.returncode == 7
    assert marker.read_text() == str(child.pid)
    assert out.startswith("gpugate admit: whisper: start lease ")


async def test_a_refused_admit_runs_nothing_and_exits_with_its_own_code(served, tmp_path):
    marker = tmp_path / "ran"
    argv = [sys.executable, "-m", "gpugate", "admit", "nobody", "--config", str(served.config),
            "--", "touch", str(marker)]  # fmt: skip
    done = await asyncio.to_thread(
        subprocess.run, argv, env=served.env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == Exit.DATAERR and not marker.exists()
    assert (await served.status())["leases"] == []
    missing = [sys.executable, "-m", "gpugate", "admit", "whisper", "--config",
               str(served.config), "--", str(tmp_path / "no-such-program")]  # fmt: skip
    done = await asyncio.to_thread(
        subprocess.run, missing, env=served.env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 127 and "command not found" in done.stderr
