"""Starting and stopping a simulated whisper-server process: its argv, and `SimWhisper`."""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
from pathlib import Path
from types import TracebackType

import gpugate
from gpugate.sim.whisper.server import LISTENING
from gpugate.sim.whisper.spec import WhisperServerSpec

MODULE = "gpugate.sim.whisper"


def split_listen(listen: str) -> tuple[str, int]:
    """HOST:PORT → (host, port)."""
    host, sep, port = listen.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"whisper.listen: expected HOST:PORT, got {listen!r}")
    return host.strip("[]") or "127.0.0.1", int(port)


def whisper_argv(
    spec: WhisperServerSpec, state_dir: Path | None = None, *, python: str = sys.executable
) -> list[str]:
    """The command that runs `spec`: whisper-server's own options, then the `--sim-*` ones."""
    host, port = split_listen(spec.listen)
    argv = [python, "-m", MODULE, "-m", spec.model, "--host", host, "--port", str(port)]
    if spec.inference_path != "/inference":
        argv += ["--inference-path", spec.inference_path]
    if spec.request_path:
        argv += ["--request-path", spec.request_path]
    if spec.gpu:
        argv += ["-dev", str(spec.gpu)]
    if state_dir is not None:
        argv += ["--sim-state-dir", str(state_dir)]
    for path, size in spec.models.items():
        argv += ["--sim-model-size", f"{path}={size}"]
    if spec.record is not None:
        # Absolute: the process may start elsewhere than the one that read the host file.
        argv += ["--sim-record", os.path.abspath(spec.record)]
    return [
        *argv,
        "--sim-load-seconds", repr(spec.load_seconds),
        "--sim-decode-seconds", repr(spec.decode_seconds),
        "--sim-decode-per-audio-second", repr(spec.decode_per_audio_second),
        "--sim-keepalive-timeout", repr(spec.keepalive_timeout),
        "--sim-keepalive-max", str(spec.keepalive_max),
        "--sim-oom", spec.oom,
    ]  # fmt: skip


def child_env(base: dict[str, str] | None = None) -> dict[str, str]:
    """`base` (default: this environment) with this checkout first on PYTHONPATH."""
    env = dict(os.environ if base is None else base)
    root = str(Path(gpugate.__file__).resolve().parents[1])
    paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    if root not in paths:
        env["PYTHONPATH"] = os.pathsep.join([root, *paths])
    return env


class WhisperStartError(RuntimeError):
    """The process exited (or stayed silent) before it listened; `returncode` says how."""

    def __init__(self, message: str, returncode: int | None) -> None:
        super().__init__(message)
        self.returncode = returncode


class SimWhisper:
    """A simulated whisper-server as a child process; start() and stop() as often as needed.

    start() returns once the server listens (its model is in VRAM by then) and sets `url`.
    Its stderr is kept in `stderr_lines`; `returncode` is set once it has exited.
    """

    def __init__(
        self,
        spec: WhisperServerSpec,
        state_dir: Path,
        *,
        env: dict[str, str] | None = None,
        timeout: float = 30.0,
    ) -> None:
        self.spec = spec
        self.state_dir = state_dir
        self.env = env
        self.timeout = timeout
        self.popen: subprocess.Popen[str] | None = None
        self.url: str | None = None
        self.stdout_lines: list[str] = []
        self.stderr_lines: list[str] = []
        self._listening: queue.SimpleQueue[str | None] = queue.SimpleQueue()
        self._stderr_reader: threading.Thread | None = None

    @property
    def pid(self) -> int:
        assert self.popen is not None, "not started"
        return self.popen.pid

    @property
    def returncode(self) -> int | None:
        return None if self.popen is None else self.popen.poll()

    def spawn(self) -> SimWhisper:
        """Start the process without waiting for it to listen."""
        self.url = None
        self.stdout_lines, self.stderr_lines = [], []
        self._listening = queue.SimpleQueue()
        self.popen = subprocess.Popen(
            whisper_argv(self.spec, self.state_dir),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            errors="replace",
            bufsize=1,
            env=child_env(self.env),
        )
        threading.Thread(target=self._read_stdout, args=(self.popen,), daemon=True).start()
        self._stderr_reader = threading.Thread(
            target=self._read_stderr, args=(self.popen,), daemon=True
        )
        self._stderr_reader.start()
        return self

    def wait_listening(self, timeout: float | None = None) -> str:
        """The server's URL once it listens; WhisperStartError if it exits first."""
        try:
            line = self._listening.get(timeout=self.timeout if timeout is None else timeout)
        except queue.Empty:
            raise WhisperStartError("whisper-server did not listen in time", None) from None
        if line is None:
            code = self.wait(timeout=10.0)
            # The process has exited: its stderr ends, so the reader finishes.
            if self._stderr_reader is not None:
                self._stderr_reader.join(timeout=10.0)
            raise WhisperStartError(
                f"whisper-server exited with {code}: {' | '.join(self.stderr_lines[-4:])}", code
            )
        self.url = line.split()[-1]
        return self.url

    def start(self) -> str:
        """spawn() and wait_listening(); the URL."""
        return self.spawn().wait_listening()

    def wait(self, timeout: float) -> int | None:
        assert self.popen is not None, "not started"
        try:
            return self.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None

    def stop(self, timeout: float = 10.0) -> int | None:
        """SIGTERM (SIGKILL after `timeout` seconds); the exit code."""
        if self.popen is None:
            return None
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
        code = self.wait(timeout)
        if code is None:
            self.popen.kill()
            code = self.wait(timeout)
        return code

    def kill(self) -> int | None:
        """SIGKILL and reap; the exit code."""
        if self.popen is None:
            return None
        if self.popen.poll() is None:
            self.popen.kill()
        return self.wait(10.0)

    def __enter__(self) -> SimWhisper:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def _read_stdout(self, popen: subprocess.Popen[str]) -> None:
        assert popen.stdout is not None
        announced = False
        for line in popen.stdout:
            line = line.rstrip("\n")
            self.stdout_lines.append(line)
            if not announced and line.startswith(LISTENING):
                announced = True
                self._listening.put(line)
        if not announced:
            self._listening.put(None)

    def _read_stderr(self, popen: subprocess.Popen[str]) -> None:
        assert popen.stderr is not None
        for line in popen.stderr:
            self.stderr_lines.append(line.rstrip("\n"))
