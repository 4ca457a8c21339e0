"""`gpugate sim run` and `gpugate serve` as subprocesses, for end-to-end and fault tests.

A test writes a HOST.yaml and a consumers.yaml, starts the simulated host, then the gate
with the environment the host printed, and talks to both only over their public ports.
"""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import attrs

from gpugate_sim.device import SimulatedGpuHost
from gpugate_sim.hostprocess import SimulatedHostProcess
from tests.sim.processes import LineReader


@attrs.define
class GateProcess:
    """A running `gpugate serve --config FILE`, its output read on threads."""

    config: Path
    env: dict[str, str]
    listen: str
    control: str
    process: subprocess.Popen[str] = attrs.field(default=None)
    stdout: LineReader = attrs.field(default=None)
    stderr: LineReader = attrs.field(default=None)

    def start(self, ready_timeout: float = 20.0) -> GateProcess:
        """Start the gate and return once it printed `gpugate: ready`."""
        self.process = subprocess.Popen(
            [sys.executable, "-m", "gpugate", "serve", "--config", str(self.config)],
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.stdout = LineReader(self.process.stdout)
        self.stderr = LineReader(self.process.stderr)
        self.stdout.until("gpugate: ready", timeout=ready_timeout)
        return self

    @property
    def pid(self) -> int:
        return self.process.pid

    def alive(self) -> bool:
        return self.process.poll() is None

    def signal(self, signum: int) -> None:
        self.process.send_signal(signum)

    def stop(self, timeout: float = 30.0) -> int | None:
        """SIGTERM, then SIGKILL if it does not exit within `timeout`; the exit code."""
        if self.process is None:
            return None
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
        return self.process.returncode

    def kill(self) -> None:
        """SIGKILL: no shutdown code runs, as when the OOM killer or a power cut stops it."""
        self.process.kill()
        self.process.wait(timeout=10)

    def stderr_lines(self, settle: float = 0.2) -> list[str]:
        """Every stderr line read so far, after letting the reader catch up for `settle` s."""
        deadline = time.monotonic() + settle
        with contextlib.suppress(AssertionError):
            while time.monotonic() < deadline:
                if self.stderr.next(timeout=max(0.01, deadline - time.monotonic())) is None:
                    break
        return list(self.stderr.seen)

    async def get_json(self, path: str) -> Any:
        async with aiohttp.ClientSession() as session, session.get(self.control + path) as resp:
            return await resp.json(content_type=None)

    async def get_text(self, path: str) -> tuple[int, str]:
        async with aiohttp.ClientSession() as session, session.get(self.control + path) as resp:
            return resp.status, await resp.text()

    async def status(self) -> dict[str, Any]:
        """/gate/v1/status as JSON."""
        return await self.get_json("/gate/v1/status")

    async def events(self) -> list[dict[str, Any]]:
        """/gate/v1/events, one JSON object per line."""
        _, text = await self.get_text("/gate/v1/events")
        return [json.loads(line) for line in text.splitlines() if line.strip()]

    async def metrics(self) -> str:
        return (await self.get_text("/metrics"))[1]


@attrs.define
class HostProcess:
    """A running `gpugate sim run HOST.yaml`: its state directory and its Ollama's URL."""

    host: SimulatedHostProcess
    gpu: SimulatedGpuHost
    ollama: str | None

    def env(self, **extra: str) -> dict[str, str]:
        """The environment a gate needs to see this host through the fake NVML library."""
        assert self.host.environment is not None
        return {**self.host.environment.apply(), **extra}

    async def sim_state(self) -> dict[str, Any]:
        """The simulated Ollama's /sim/state: runners, counters, requests in flight."""
        assert self.ollama is not None
        return await self.sim_get("/sim/state")

    async def sim_get(self, path: str) -> Any:
        """GET a /sim/ view of the simulated Ollama as JSON."""
        assert self.ollama is not None
        async with aiohttp.ClientSession() as session, session.get(self.ollama + path) as resp:
            return await resp.json()

    async def set_faults(self, **switches: object) -> None:
        """Switch simulated Ollama faults on or off (gpugate_sim.ollama.faults)."""
        assert self.ollama is not None
        url = self.ollama + "/sim/faults"
        async with aiohttp.ClientSession() as session, session.post(url, json=switches) as resp:
            assert resp.status == 200, await resp.text()


@contextlib.contextmanager
def running_host(
    host_file: Path, state_dir: Path, ollama_port: int | None
) -> Iterator[HostProcess]:
    """`gpugate sim run` for the duration of the block."""
    with SimulatedHostProcess(host_file, state_dir) as host:
        ollama = None if ollama_port is None else f"http://127.0.0.1:{ollama_port}"
        yield HostProcess(host, SimulatedGpuHost(state_dir), ollama)


@contextlib.contextmanager
def running_gate(
    config: Path, env: dict[str, str], listen: int, control: int
) -> Iterator[GateProcess]:
    """`gpugate serve --config FILE` for the duration of the block; stopped after."""
    gate = GateProcess(config, env, f"http://127.0.0.1:{listen}", f"http://127.0.0.1:{control}")
    try:
        yield gate.start()
    finally:
        gate.stop()
