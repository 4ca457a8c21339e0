"""whisper.cpp's whisper-server, real and simulated, started as subprocesses on free ports.

`whisper_server_binary` is the CPU build `make build/whisper-server` leaves
(tests/whisper/build.sh). `server_kind` is parametrized over `real` (that binary) and `sim`
(`python -m gpugate_sim.whisper` with the same argv, on a simulated card of its own); a
starter runs one with `-m MODEL --host 127.0.0.1 --port P -t 1`, waits for `GET /health`
to answer 200 (unless told not to), and stops it with SIGTERM, then SIGKILL, in teardown.
Its stdout and stderr go to files the tests read.
"""

from __future__ import annotations

import contextlib
import platform
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import attrs
import pytest

import gpugate_sim.whisper
from gpugate.core.units import GiB
from gpugate_sim.device import SimDevice, SimulatedGpuHost
from tests import buildcache
from tests.buildcache import tail
from tests.ports import free_port
from tests.whisper.ggml_models import write_english, write_multilingual

ROOT = Path(__file__).resolve().parents[2]
BINARY = ROOT / "build" / "whisper-server"
SIM_MODULE = gpugate_sim.whisper.__name__
"""The simulator, run as `python -m`: imported here, so that one that moved fails the
suite instead of skipping its half."""
VERSION = "1.5.1"
READY_SECONDS = 60.0
FUTEX = {"x86_64": 202, "aarch64": 98}[platform.machine()]
"""The futex system call's number here, as /proc/PID/task/TID/syscall shows it."""
STOP_SECONDS = 10.0
LOADING = "whisper_init_from_file_with_params_no_state: loading model from '"
"""The line whisper.cpp logs on stderr as it starts to load a model (at start and for
every /load past its checks: the old model is freed by then)."""


def locate_binary(binary: Path = BINARY) -> Path:
    """build/whisper-server; a failure, not a skip, when this machine could have built it."""
    return buildcache.locate_binary(binary, "whisper-server", VERSION)


@pytest.fixture(scope="session")
def whisper_server_binary() -> Path:
    return locate_binary()


@pytest.fixture(scope="module", params=["real", "sim"])
def server_kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def wait_for(condition: Callable[[], bool], seconds: float, what: str) -> None:
    """Poll `condition` until it holds; fail with `what` after `seconds`."""
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {seconds:.0f}s waiting for {what}", pytrace=False)
        time.sleep(0.02)


@attrs.define
class WhisperServer:
    kind: str
    argv: list[str]
    port: int
    out_path: Path
    err_path: Path
    proc: subprocess.Popen[bytes]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        return self.proc.pid

    def stderr(self) -> str:
        return self.err_path.read_text(errors="replace")

    def stdout(self) -> str:
        return self.out_path.read_text(errors="replace")

    def loads(self) -> list[str]:
        """The model paths it started to load, in order (the start's first)."""
        found = []
        for line in self.stderr().splitlines():
            if line.startswith(LOADING) and line.endswith("'"):
                found.append(line[len(LOADING) : -1])
        return found

    def answers(self) -> bool:
        """Whether /health answers at all (any status)."""
        with (
            contextlib.suppress(OSError),
            socket.create_connection(("127.0.0.1", self.port), timeout=2) as sock,
        ):
            sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            return sock.recv(12).startswith(b"HTTP/1.1 ")
        return False

    def wait_healthy(self, seconds: float = READY_SECONDS) -> None:
        deadline = time.monotonic() + seconds
        while True:
            if self.proc.poll() is not None:
                pytest.fail(
                    f"{self.kind} whisper-server exited with {self.proc.returncode} before "
                    f"/health answered; argv {self.argv}\n{tail(self.err_path)}",
                    pytrace=False,
                )
            if self.answers():
                return
            if time.monotonic() > deadline:
                pytest.fail(
                    f"{self.kind} whisper-server did not answer after {seconds:.0f}s\n"
                    f"{tail(self.err_path)}",
                    pytrace=False,
                )
            time.sleep(0.02)

    def wait_settled(self, seconds: float = READY_SECONDS) -> None:
        """Until the real server's main thread waits in its join of the listener (a futex).

        whisper-server's main thread polls cpp-httplib's `wait_until_ready` every 1 ms for
        `is_running_`; a SIGTERM that ends the listener before the main thread has seen it
        running leaves main polling forever (`stop()` also clears `is_decommissioned`), so a
        test of the signal's effect sends it only once main has passed that poll. The
        simulator has no such window."""
        if self.kind != "real":
            return
        syscall = Path(f"/proc/{self.pid}/task/{self.pid}/syscall")
        wait_for(
            lambda: syscall.read_text().split(" ", 1)[0] == str(FUTEX),
            seconds,
            "whisper-server's main thread to join its listener",
        )

    def wait_exit(self, seconds: float = STOP_SECONDS * 3) -> int:
        try:
            return self.proc.wait(seconds)
        except subprocess.TimeoutExpired:
            pytest.fail(f"{self.kind} whisper-server still running after {seconds:.0f}s")

    def stop(self) -> int | None:
        """SIGTERM, SIGKILL after STOP_SECONDS."""
        code = self.proc.poll()
        if code is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                code = self.proc.wait(STOP_SECONDS)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                code = self.proc.wait()
        return code


StartServer = Callable[..., WhisperServer]


def command_for(kind: str, request: pytest.FixtureRequest, directory: Path) -> list[str]:
    if kind == "real":
        return [str(request.getfixturevalue("whisper_server_binary"))]
    gpu = directory / "sim-gpu"
    if not gpu.exists():
        SimulatedGpuHost.create(gpu, [SimDevice(0, 16 * GiB, 0, "GPU-conformance", "sim")])
    return [sys.executable, "-m", SIM_MODULE, "--sim-state-dir", str(gpu)]


@contextlib.contextmanager
def server_starter(
    kind: str, command: Sequence[str], directory: Path
) -> Iterator[Callable[..., WhisperServer]]:
    started: list[WhisperServer] = []

    def start(
        args: Sequence[str], *, wait: bool = True, port: int | None = None, threads: bool = True
    ) -> WhisperServer:
        port = free_port() if port is None else port
        extra = ["-t", "1"] if threads else []
        argv = [*command, *args, "--host", "127.0.0.1", "--port", str(port), *extra]
        out_path = directory / f"server-{port}-{len(started)}.out"
        err_path = directory / f"server-{port}-{len(started)}.err"
        with out_path.open("wb") as out, err_path.open("wb") as err:
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                cwd=directory,
                start_new_session=True,
            )
        server = WhisperServer(kind, argv, port, out_path, err_path, proc)
        started.append(server)
        if wait:
            server.wait_healthy()
        return server

    try:
        yield start
    finally:
        for server in started:
            server.stop()


@attrs.frozen
class Models:
    """Model files the tests load, and paths that are not models."""

    english: Path
    english_other: Path
    multilingual: Path
    not_a_model: Path
    directory: Path
    missing: Path


@pytest.fixture(scope="session")
def models(tmp_path_factory: pytest.TempPathFactory) -> Models:
    directory = tmp_path_factory.mktemp("ggml")
    garbage = directory / "garbage.bin"
    garbage.write_bytes(b"not a ggml model\n" * 8)
    folder = directory / "folder.bin"
    folder.mkdir()
    return Models(
        english=write_english(directory / "ggml-tiny.en.bin", seed=1),
        english_other=write_english(directory / "ggml-other.en.bin", seed=2),
        multilingual=write_multilingual(directory / "ggml-tiny.bin", seed=3),
        not_a_model=garbage,
        directory=folder,
        missing=directory / "missing.bin",
    )


@pytest.fixture(scope="module")
def module_starter(
    server_kind: str, request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[StartServer]:
    directory = tmp_path_factory.mktemp(f"{server_kind}-servers")
    with server_starter(server_kind, command_for(server_kind, request, directory), directory) as s:
        yield s


@pytest.fixture
def starter(
    server_kind: str, request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[StartServer]:
    """Start servers of this test's kind; each is stopped when the test ends."""
    with server_starter(server_kind, command_for(server_kind, request, tmp_path), tmp_path) as s:
        yield s
