"""Process control with real processes: the simulated whisper-server, a fake systemctl."""

from __future__ import annotations

import asyncio
import os
import signal
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from aiohttp import web

from gpugate.core.units import GiB, MiB
from gpugate.runtimes.process import (
    Exit,
    NotReady,
    ProcessControlError,
    ProcessExited,
    SystemctlError,
)
from gpugate.runtimes.process_ready import wait_ready
from gpugate.runtimes.process_supervised import SupervisedCommand
from gpugate.runtimes.process_systemd import SystemdUnit, UnitState
from gpugate_sim.device import SimDevice, SimulatedGpuHost
from gpugate_sim.serverprocess import child_env
from gpugate_sim.whisper import WhisperServerSpec, whisper_argv
from tests.ports import free_ports

TURBO = "models/ggml-large-v3-turbo.bin"
TURBO_BYTES = 2050 * MiB


def card(tmp_path: Path, total: int = 16 * GiB) -> SimulatedGpuHost:
    return SimulatedGpuHost.create(
        tmp_path / "gpu", [SimDevice(index=0, total=total, reserved=0, uuid="GPU-p", name="sim")]
    )


def whisper(gpu: SimulatedGpuHost, port: int, **kwargs: object) -> SupervisedCommand:
    spec = WhisperServerSpec(
        listen=f"127.0.0.1:{port}", model=TURBO, models={TURBO: TURBO_BYTES}, load_seconds=0.3
    )
    return SupervisedCommand(whisper_argv(spec, gpu.directory), env=child_env({}), **kwargs)


async def test_a_supervised_whisper_starts_is_ready_and_its_memory_goes_with_the_stop(
    tmp_path: Path,
) -> None:
    gpu = card(tmp_path)
    (port,) = free_ports(1)
    died: list[Exit] = []
    process = whisper(gpu, port, on_exit=died.append)
    await process.start()
    await wait_ready(f"http://127.0.0.1:{port}", "/health", timeout=30, process=process)
    assert process.pid is not None
    assert gpu.read().held_by(process.pid, 0) == TURBO_BYTES

    exit = await process.stop()

    assert exit is not None and exit.stopped and exit.returncode == 0
    assert gpu.read().processes == []
    assert not process.running and process.pid is None
    assert died == [], "a stop the gate asked for is not a death"


async def test_an_oom_start_is_reported_as_sigabrt_and_never_as_ready(tmp_path: Path) -> None:
    gpu = card(tmp_path, total=1 * GiB)
    (port,) = free_ports(1)
    died: asyncio.Queue[Exit] = asyncio.Queue()
    process = whisper(gpu, port, on_exit=died.put_nowait)
    await process.start()

    with pytest.raises(ProcessExited) as failed:
        await wait_ready(f"http://127.0.0.1:{port}", "/health", timeout=30, process=process)

    exit = failed.value.exit
    assert (exit.returncode, exit.signal, exit.shell_status) == (-6, signal.SIGABRT, 134)
    assert exit.describe() == "killed by SIGABRT (status 134)"
    assert not exit.stopped
    assert "CUDA error: out of memory" in exit.stderr_tail
    assert await asyncio.wait_for(died.get(), 10) == exit
    assert len(gpu.ooms()) == 1 and gpu.read().processes == []
    assert await process.stop() == exit, "stopping what already ended reports its end"


async def test_a_child_that_ends_on_its_own_is_reported_with_its_last_stderr_lines() -> None:
    died: asyncio.Queue[Exit] = asyncio.Queue()
    script = "for i in 1 2 3 4 5; do echo line $i >&2; done; exit 3"
    process = SupervisedCommand(["sh", "-c", script], stderr_lines=2, on_exit=died.put_nowait)
    await process.start()
    exit = await asyncio.wait_for(died.get(), 10)
    assert exit == Exit(3, ("line 4", "line 5"), stopped=False)
    assert exit.describe() == "exit status 3"


async def test_a_child_that_ignores_sigterm_is_killed_after_the_grace(tmp_path: Path) -> None:
    ready = tmp_path / "ready"
    script = f"trap '' TERM; touch {ready}; sleep 60"
    process = SupervisedCommand(["sh", "-c", script], stop_grace=0.3)
    await process.start()
    await wait_for_file(ready)
    exit = await process.stop()
    assert exit is not None and exit.returncode == -signal.SIGKILL and exit.stopped


async def test_the_command_s_env_and_cwd_are_its_own(tmp_path: Path) -> None:
    died: asyncio.Queue[Exit] = asyncio.Queue()
    process = SupervisedCommand(
        ["sh", "-c", 'echo "$WHISPER_ARG_DEVICE $(pwd)" >&2; exit 1'],
        env={"WHISPER_ARG_DEVICE": "1"},
        cwd=tmp_path,
        on_exit=died.put_nowait,
    )
    await process.start()
    assert (await asyncio.wait_for(died.get(), 10)).stderr_tail == (f"1 {tmp_path}",)


async def test_a_command_that_cannot_run_is_an_error() -> None:
    process = SupervisedCommand(["/nonexistent/whisper-server"])
    with pytest.raises(ProcessControlError, match="cannot run /nonexistent/whisper-server"):
        await process.start()
    assert not process.running


async def wait_for_file(path: Path) -> None:
    async with asyncio.timeout(10):
        while not path.exists():
            await asyncio.sleep(0.01)


# -- wait_ready ---------------------------------------------------------------------------


async def test_wait_ready_waits_through_503_until_200() -> None:
    answers = [503, 503, 200]
    asked: list[int] = []

    async def health(request: web.Request) -> web.Response:
        status = answers.pop(0)
        asked.append(status)
        return web.json_response({"status": "loading model" if status == 503 else "ok"},
                                 status=status)  # fmt: skip

    app = web.Application()
    app.router.add_get("/health", health)
    runner = web.AppRunner(app)
    await runner.setup()
    (port,) = free_ports(1)
    site = web.TCPSite(runner, "127.0.0.1", port)
    await site.start()
    try:
        await wait_ready(f"http://127.0.0.1:{port}", "/health", timeout=10, interval=0.01)
    finally:
        await runner.cleanup()
    assert asked == [503, 503, 200]


async def test_wait_ready_is_bounded_when_nothing_listens() -> None:
    (port,) = free_ports(1)
    with pytest.raises(NotReady, match=f"127.0.0.1:{port} to accept connections"):
        await wait_ready(f"http://127.0.0.1:{port}", "/health", timeout=0.3)


# -- systemctl ----------------------------------------------------------------------------

FAKE_SYSTEMCTL = """\
#!{python}
import os, sys, time
with open(os.environ["FAKE_SYSTEMCTL_LOG"], "a") as log:
    log.write(" ".join(sys.argv[1:]) + "\\n")
if os.environ.get("FAKE_SYSTEMCTL_HANG"):
    time.sleep(60)
if sys.argv[1] == "is-active":
    state = os.environ.get("FAKE_SYSTEMCTL_STATE", "active")
    print(state)
    sys.exit(0 if state in ("active", "reloading") else 3)
if os.environ.get("FAKE_SYSTEMCTL_FAIL"):
    print("Job for " + sys.argv[2] + " failed because the control process exited with "
          "error code.", file=sys.stderr)
    sys.exit(1)
"""


@pytest.fixture
def systemctl(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fake `systemctl` first on PATH; returns the file its calls are written to."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / "systemctl"
    script.write_text(textwrap.dedent(FAKE_SYSTEMCTL.format(python=sys.executable)))
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    log = tmp_path / "systemctl.log"
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_SYSTEMCTL_LOG", str(log))
    return log


async def test_a_unit_is_started_stopped_and_asked_through_systemctl(
    systemctl: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    unit = SystemdUnit("whisper-server.service")
    await unit.start()
    assert await unit.is_running()
    monkeypatch.setenv("FAKE_SYSTEMCTL_STATE", "inactive")
    assert await unit.state() is UnitState.INACTIVE and not await unit.is_running()
    assert await unit.stop() is None
    assert systemctl.read_text().splitlines() == [
        "start whisper-server.service",
        "is-active whisper-server.service",
        "is-active whisper-server.service",
        "is-active whisper-server.service",
        "stop whisper-server.service",
    ]


async def test_a_failed_start_carries_systemctl_s_stderr(
    systemctl: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_SYSTEMCTL_FAIL", "1")
    with pytest.raises(SystemctlError) as failed:
        await SystemdUnit("whisper-server.service").start()
    assert failed.value.returncode == 1
    assert "failed because the control process exited" in failed.value.stderr
    assert str(failed.value).startswith("systemctl start whisper-server.service failed")


async def test_a_systemctl_that_hangs_is_bounded(
    systemctl: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_SYSTEMCTL_HANG", "1")
    with pytest.raises(SystemctlError, match=r"did not finish within 0\.3s"):
        await SystemdUnit("whisper-server.service", stop_timeout=0.3).stop()


async def test_no_systemctl_is_an_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(SystemctlError, match="cannot run systemctl"):
        await SystemdUnit("whisper-server.service").start()


# -- finding and adopting a process the gate did not start ------------------------------


async def test_a_listener_and_a_command_are_found_and_an_adopted_one_is_stopped() -> None:
    from gpugate.runtimes.process_find import command_pids, listening_pids

    (port,) = free_ports(1)
    code = (
        "import socket, time\n"
        f"s = socket.socket(); s.bind(('127.0.0.1', {port})); s.listen()\n"
        "time.sleep(60)\n"
    )
    argv = [sys.executable, "-c", code]
    stray = subprocess.Popen(argv, start_new_session=True)
    try:
        async with asyncio.timeout(10):
            while stray.pid not in listening_pids(port):
                await asyncio.sleep(0.02)
        assert command_pids(argv) == [stray.pid]
        assert command_pids([*argv, "x"]) == []
        control = SupervisedCommand(argv, stop_grace=2.0)
        assert control.find() == stray.pid
        control.adopt(stray.pid)
        assert control.adopted and await control.is_running() and control.pid == stray.pid
        exit = await control.stop()
        assert exit is not None and exit.stopped and exit.returncode is None
        assert "status is unknown" in exit.describe()
        assert stray.wait(timeout=5) == -signal.SIGTERM
        assert not await control.is_running() and listening_pids(port) == []
    finally:
        if stray.poll() is None:
            stray.kill()
            stray.wait()


async def test_an_adopted_process_that_ends_on_its_own_is_reported() -> None:
    stray = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    ended: list[Exit] = []
    control = SupervisedCommand(["unused"], on_exit=ended.append)
    control.adopt(stray.pid)
    stray.kill()
    stray.wait()
    async with asyncio.timeout(10):
        exit = await control.ended()
    assert ended == [exit] and not exit.stopped and not control.running
