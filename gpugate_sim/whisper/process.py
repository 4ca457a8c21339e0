"""Starting and stopping a simulated whisper-server process: its argv, and `SimWhisper`.

whisper-server says it listens only in a stdout line that a pipe sees at its exit (C's
buffering), so a starter learns it is up from the port: the process holds a listening
socket on it (it binds only once the model is loaded) and `GET /health` answers 200. The
socket is looked up in /proc because another server may listen on the same port
(SO_REUSEPORT) and answer for it. A port 0 is chosen here, before the start: the server
would print 0 whatever it bound.
"""

from __future__ import annotations

import atexit
import contextlib
import http.client
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import IO

import attrs

import gpugate_sim
from gpugate_sim.whisper.spec import WhisperServerSpec

MODULE = "gpugate_sim.whisper"
POLL_INTERVAL = 0.02
"""Seconds between two probes of a starting server."""


def split_listen(listen: str) -> tuple[str, int]:
    """HOST:PORT → (host, port)."""
    host, sep, port = listen.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"whisper.listen: expected HOST:PORT, got {listen!r}")
    return host.strip("[]") or "127.0.0.1", int(port)


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on now (the kernel's pick for a bind to port 0)."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def with_port(spec: WhisperServerSpec) -> WhisperServerSpec:
    """`spec` with a port 0 replaced by a free one."""
    host, port = split_listen(spec.listen)
    if port:
        return spec
    return attrs.evolve(spec, listen=f"{host}:{free_port(host)}")


def url_of(spec: WhisperServerSpec) -> str:
    host, port = split_listen(spec.listen)
    return f"http://{host}:{port}"


def listens(pid: int, port: int) -> bool:
    """Whether process `pid` holds a TCP socket listening on `port`."""
    inodes = set()
    with contextlib.suppress(OSError):
        for fd in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
                if link.startswith("socket:["):
                    inodes.add(link[len("socket:[") : -1])
    for table in ("tcp", "tcp6"):
        with contextlib.suppress(OSError):
            for row in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
                fields = row.split()
                # local_address is HEX_IP:HEX_PORT; state 0A is LISTEN.
                local, state, inode = fields[1], fields[3], fields[9]
                if state == "0A" and int(local.rsplit(":", 1)[1], 16) == port and inode in inodes:
                    return True
    return False


def wait_serving(
    spec: WhisperServerSpec, pid: int, exited: Callable[[], int | None], timeout: float
) -> str:
    """Block until process `pid`, started from `spec`, listens and `GET /health` answers
    200; its URL.

    `exited` is polled too: WhisperStartError with the exit code as soon as it says the
    process has ended, or with None when `timeout` seconds pass first.
    """
    host, port = split_listen(spec.listen)
    path = spec.request_path + "/health"
    deadline = time.monotonic() + timeout
    while True:
        code = exited()
        if code is not None:
            raise WhisperStartError(f"whisper-server exited with {code}", code)
        probe = max(0.1, min(1.0, deadline - time.monotonic()))
        if listens(pid, port) and _healthy(host, port, path, probe):
            return url_of(spec)
        if time.monotonic() >= deadline:
            raise WhisperStartError("whisper-server did not listen in time", None)
        time.sleep(POLL_INTERVAL)


def _healthy(host: str, port: int, path: str, timeout: float) -> bool:
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        conn.request("GET", path)
        return conn.getresponse().status == 200
    except (OSError, http.client.HTTPException):
        return False
    finally:
        conn.close()


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
    root = str(Path(gpugate_sim.__file__).resolve().parents[1])
    paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    if root not in paths:
        env["PYTHONPATH"] = os.pathsep.join([root, *paths])
    return env


class WhisperStartError(RuntimeError):
    """The process exited (or stayed silent) before it listened; `returncode` says how."""

    def __init__(self, message: str, returncode: int | None) -> None:
        super().__init__(message)
        self.returncode = returncode


_running: weakref.WeakSet[SimWhisper] = weakref.WeakSet()


@atexit.register
def _stop_leftovers() -> None:
    # The server outlives its starter, as the real one does; a test process that ends
    # normally still takes the ones it started (and did not stop) with it.
    for sim in list(_running):
        with contextlib.suppress(Exception):
            sim.kill()


class SimWhisper:
    """A simulated whisper-server as a child process; start() and stop() as often as needed.

    start() returns once the server answers /health (its model is in VRAM by then) and sets
    `url`; a spec on port 0 gets a free port first (`listen` then names it). Its stdout and
    stderr are kept in `stdout_lines` and `stderr_lines` (stdout mostly at its exit: C
    buffering); `returncode` is set once it has exited.
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
        self.listen = spec.listen
        self.stdout_lines: list[str] = []
        self.stderr_lines: list[str] = []
        self._readers: list[threading.Thread] = []
        self._started: WhisperServerSpec = spec

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
        # A restart keeps the port chosen for port 0: the same server, again.
        self._started = with_port(attrs.evolve(self.spec, listen=self.listen))
        self.listen = self._started.listen
        self.popen = subprocess.Popen(
            whisper_argv(self._started, self.state_dir),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            errors="replace",
            bufsize=1,
            env=child_env(self.env),
        )
        _running.add(self)
        self._readers = [
            threading.Thread(target=_collect, args=(stream, lines), daemon=True)
            for stream, lines in (
                (self.popen.stdout, self.stdout_lines),
                (self.popen.stderr, self.stderr_lines),
            )
        ]
        for reader in self._readers:
            reader.start()
        return self

    def wait_listening(self, timeout: float | None = None) -> str:
        """The server's URL once it serves; WhisperStartError if it exits first."""
        assert self.popen is not None, "not started"
        try:
            self.url = wait_serving(
                self._started,
                self.popen.pid,
                self.popen.poll,
                self.timeout if timeout is None else timeout,
            )
        except WhisperStartError as exc:
            if exc.returncode is None:
                raise
            # The process has exited: its output ends, so the readers finish.
            self._join_readers()
            raise WhisperStartError(
                f"{exc}: {' | '.join(self.stderr_lines[-4:])}", exc.returncode
            ) from None
        return self.url

    def start(self) -> str:
        """spawn() and wait_listening(); the URL."""
        return self.spawn().wait_listening()

    def wait(self, timeout: float) -> int | None:
        """The exit code once the process has exited (its output read to the end)."""
        assert self.popen is not None, "not started"
        try:
            code = self.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None
        self._join_readers()
        return code

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

    def _join_readers(self) -> None:
        for reader in self._readers:
            # A grandchild holding the pipes could keep them open: do not wait forever.
            reader.join(timeout=10.0)


def _collect(stream: IO[str] | None, lines: list[str]) -> None:
    assert stream is not None
    with contextlib.suppress(OSError, ValueError):
        for line in stream:
            lines.append(line.rstrip("\n"))
