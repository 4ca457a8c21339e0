"""The simulated whisper-server as a process: VRAM before the port, OOM, exit, attribution."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpugate.config.model import ProcessMatch
from gpugate.core.observation import Owner, OwnerKind
from gpugate.core.units import GiB, MiB
from gpugate.gpu.attribution import MatchKind, ProcessAttributor
from gpugate_sim.device import SimDevice, SimulatedGpuHost
from gpugate_sim.whisper import SimWhisper, WhisperServerSpec, WhisperStartError
from tests.gpu.support import consumer
from tests.ports import free_ports
from tests.sim.processes import cmdline, comm, pid_exists

TURBO = "models/ggml-large-v3-turbo.bin"
TURBO_BYTES = 2050 * MiB
WAIT = 20.0


def card(tmp_path: Path, total: int = 16 * GiB) -> SimulatedGpuHost:
    return SimulatedGpuHost.create(
        tmp_path / "gpu", [SimDevice(index=0, total=total, reserved=0, uuid="GPU-w", name="sim")]
    )


def spec(port: int = 0, **changes: object) -> WhisperServerSpec:
    values: dict[str, object] = {
        "listen": f"127.0.0.1:{port}",
        "model": TURBO,
        "models": {TURBO: TURBO_BYTES, "ggml-base.en.bin": 200 * MiB},
    }
    values.update(changes)
    return WhisperServerSpec(**values)  # type: ignore[arg-type]


def held(gpu: SimulatedGpuHost, pid: int) -> int:
    return gpu.read().held_by(pid, 0)


def wait_for(condition: object, what: str) -> None:
    """Poll a state only visible in the shared device file, with a deadline."""
    deadline = time.monotonic() + WAIT
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def refused(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) != 0


@pytest.fixture
def gpu(tmp_path: Path) -> Iterator[SimulatedGpuHost]:
    yield card(tmp_path)


def test_the_model_is_in_vram_before_the_port_is_bound(gpu: SimulatedGpuHost) -> None:
    (port,) = free_ports(1)
    sim = SimWhisper(spec(port, load_seconds=2.0), gpu.directory).spawn()
    try:
        # The weights arrive at once; the state after the load time; then the bind.
        wait_for(lambda: held(gpu, sim.pid) > 0, "the weights in VRAM")
        assert refused(port), "the port must refuse while the model loads"
        assert sim.wait_serving() == f"http://127.0.0.1:{port}"
        assert held(gpu, sim.pid) == TURBO_BYTES
        assert not refused(port)
    finally:
        assert sim.stop() == 0
    assert gpu.read().processes == []


def test_a_model_that_does_not_fit_aborts_and_the_host_records_the_oom(tmp_path: Path) -> None:
    small = card(tmp_path, total=1 * GiB)
    sim = SimWhisper(spec(), small.directory)
    with pytest.raises(WhisperStartError) as failed:
        sim.start()
    assert failed.value.returncode == -signal.SIGABRT
    assert any("cudaMalloc failed: out of memory" in line for line in sim.stderr_lines)
    assert "whisper_model_load: failed to allocate memory for the model" in sim.stderr_lines
    (oom,) = small.ooms()
    assert (oom.pid, oom.name) == (sim.pid, "whisper-server")
    assert small.read().processes == []


def test_oom_exit_mode_ends_as_server_cpp_does_with_status_3(tmp_path: Path) -> None:
    small = card(tmp_path, total=1 * GiB)
    sim = SimWhisper(spec(oom="exit"), small.directory)
    with pytest.raises(WhisperStartError) as failed:
        sim.start()
    assert failed.value.returncode == 3
    assert sim.stderr_lines[-1] == "error: failed to initialize whisper context"
    assert len(small.ooms()) == 1 and small.read().processes == []


def test_a_missing_model_file_fails_the_start_with_status_3(gpu: SimulatedGpuHost) -> None:
    sim = SimWhisper(spec(model="models/nope.bin"), gpu.directory)
    with pytest.raises(WhisperStartError) as failed:
        sim.start()
    assert failed.value.returncode == 3
    assert "whisper_init_from_file_with_params_no_state: failed to open 'models/nope.bin'" in (
        sim.stderr_lines
    )
    assert gpu.ooms() == []


@pytest.mark.parametrize("ending", ["sigterm", "sigkill"])
def test_memory_is_gone_when_the_process_ends(gpu: SimulatedGpuHost, ending: str) -> None:
    sim = SimWhisper(spec(), gpu.directory)
    sim.start()
    assert held(gpu, sim.pid) == TURBO_BYTES
    code = sim.stop() if ending == "sigterm" else sim.kill()
    assert code == (0 if ending == "sigterm" else -signal.SIGKILL)
    assert not pid_exists(sim.pid)
    assert gpu.read().processes == []
    assert gpu.free() == 16 * GiB


def test_it_can_be_stopped_and_started_again_on_the_same_port(gpu: SimulatedGpuHost) -> None:
    (port,) = free_ports(1)
    sim = SimWhisper(spec(port), gpu.directory)
    first = sim.start()
    first_pid = sim.pid
    assert sim.stop() == 0
    assert sim.start() == first
    assert sim.pid != first_pid and held(gpu, sim.pid) == TURBO_BYTES
    assert sim.stop() == 0


def test_it_looks_like_whisper_server_and_is_attributed_as_one(gpu: SimulatedGpuHost) -> None:
    (port,) = free_ports(1)
    with SimWhisper(spec(port, inference_path="/v1/audio/transcriptions"), gpu.directory) as sim:
        assert comm(sim.pid) == "whisper-server"
        assert cmdline(sim.pid) == [
            "whisper-server", "-m", TURBO, "--host", "127.0.0.1", "--port", str(port),
            "--inference-path", "/v1/audio/transcriptions",
        ]  # fmt: skip
        by_command = ProcessAttributor(
            [consumer("whisper", ProcessMatch(commands=("whisper-server",)))]
        )
        by_name = ProcessAttributor([consumer("whisper", ProcessMatch(names=("whisper-server",)))])
        owner = Owner(OwnerKind.CONSUMER, "whisper")
        found = by_command.explain(sim.pid)
        assert (found.owner, found.match, found.via) == (owner, MatchKind.COMMAND, sim.pid)
        found = by_name.explain(sim.pid)
        assert (found.owner, found.match, found.name) == (owner, MatchKind.NAME, "whisper-server")
        pids = [p.pid for p in gpu.read().processes]
        assert pids == [sim.pid]


def test_it_survives_its_parent(gpu: SimulatedGpuHost, tmp_path: Path) -> None:
    # A plain process, as whisper-server is: a starter killed with SIGKILL leaves it serving.
    script = tmp_path / "parent.py"
    script.write_text(
        "import signal\n"
        "from pathlib import Path\n"
        "from gpugate_sim.whisper import SimWhisper, WhisperServerSpec\n"
        f"sim = SimWhisper(WhisperServerSpec(listen='127.0.0.1:0', model={TURBO!r},"
        f" models={{{TURBO!r}: {TURBO_BYTES}}}), Path({str(gpu.directory)!r}))\n"
        "sim.start()\n"
        "print(sim.pid, sim.url, flush=True)\n"
        "signal.pause()\n"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    parent = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, env=env)
    child = 0
    try:
        assert parent.stdout is not None
        pid, url = parent.stdout.readline().split()
        child = int(pid)
        parent.kill()
        assert parent.wait(timeout=10) == -signal.SIGKILL
        with urllib.request.urlopen(url.decode() + "/health", timeout=10) as answer:
            assert (answer.status, answer.read()) == (200, b'{"status":"ok"}')
        assert pid_exists(child) and held(gpu, child) == TURBO_BYTES
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait(timeout=10)
        if child:
            with contextlib.suppress(ProcessLookupError):
                os.kill(child, signal.SIGKILL)

    def gone() -> bool:
        # An earlier test may have made this process a subreaper (the in-process simulated
        # host does): the orphan is then ours, and stays a zombie until we reap it.
        with contextlib.suppress(ChildProcessError):
            os.waitpid(child, os.WNOHANG)
        return not pid_exists(child)

    wait_for(gone, "the orphaned server to be killed")
    assert gpu.read().processes == []
