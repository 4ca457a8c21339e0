"""A simulated server as a child process: what starts it, how a starter learns it serves, and
`ServerProcess`, the one scaffold `SimWhisper`, `SimVllm` and `SimLlamaServer` are built on.

whisper-server and vLLM say they are up only in lines a pipe may not see in time (C's stdout
buffering, log lines), and llama-server binds before it loads, so a starter learns it is up
from the port: the process holds a listening socket on it and its health route answers 200.
The socket is looked up in /proc because another server may share the port (SO_REUSEPORT)
and answer for it. A port 0 is chosen here, before the start: the servers would print 0
whatever they bound.
"""

from __future__ import annotations

import atexit
import contextlib
import http.client
import os
import signal
import socket
import subprocess
import threading
import time
import weakref
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import IO, ClassVar, Generic, Protocol, Self, TypeVar

import attrs

import gpugate_sim

POLL_INTERVAL = 0.02
"""Seconds between two probes of a starting server."""
READ_JOIN = 10.0
"""Seconds to wait for a stopped server's output: a grandchild may hold its pipes open."""


def split_listen(listen: str, section: str) -> tuple[str, int]:
    """HOST:PORT → (host, port); `section` names the host file's part in the error."""
    host, sep, port = listen.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"{section}.listen: expected HOST:PORT, got {listen!r}")
    return host.strip("[]") or "127.0.0.1", int(port)


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on now (the kernel's pick for a bind to port 0)."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def with_free_port(listen: str, section: str) -> str:
    """`listen` with a port 0 replaced by a free one."""
    host, port = split_listen(listen, section)
    return listen if port else f"{host}:{free_port(host)}"


class Listening(Protocol):
    """A server's part of the host file: where it listens."""

    @property
    def listen(self) -> str: ...


SpecT = TypeVar("SpecT", bound=Listening)


def with_port(spec: SpecT, section: str) -> SpecT:
    """`spec` (an attrs record) with a port 0 replaced by a free one."""
    listen = with_free_port(spec.listen, section)
    return spec if listen == spec.listen else attrs.evolve(spec, listen=listen)


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


def child_env(base: Mapping[str, str] | None = None) -> dict[str, str]:
    """`base` (default: this environment) with the simulator's root first on PYTHONPATH: the
    child runs `python -m gpugate_sim...` and must import this copy of it."""
    env = dict(os.environ if base is None else base)
    root = str(Path(gpugate_sim.__file__).resolve().parents[1])
    paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    if root not in paths:
        env["PYTHONPATH"] = os.pathsep.join([root, *paths])
    return env


class ServerStartError(RuntimeError):
    """The process exited (or did not serve in time) before it served; `returncode` says how
    (None: it was still running)."""

    def __init__(self, message: str, returncode: int | None) -> None:
        super().__init__(message)
        self.returncode = returncode


@attrs.frozen
class Launch:
    """What runs one simulated server, and where it says that it serves."""

    program: str
    """The real program's name, for messages: `whisper-server`, `vllm serve`, `llama-server`."""
    argv: list[str]
    env: dict[str, str]
    host: str
    port: int
    health: str = "/health"
    """The path that answers 200 once the server serves."""

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"


def healthy(host: str, port: int, path: str, timeout: float) -> bool:
    """Whether `GET path` answers 200."""
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        conn.request("GET", path)
        return conn.getresponse().status == 200
    except (OSError, http.client.HTTPException):
        return False
    finally:
        conn.close()


def wait_serving(
    launch: Launch,
    pid: int,
    exited: Callable[[], int | None],
    timeout: float,
    error: type[ServerStartError] = ServerStartError,
) -> str:
    """Block until process `pid`, started from `launch`, listens on its port and its health
    route answers 200; its URL.

    `exited` is polled too: `error` with the exit code as soon as it says the process has
    ended, or with None when `timeout` seconds pass first.
    """
    deadline = time.monotonic() + timeout
    while True:
        code = exited()
        if code is not None:
            raise error(f"{launch.program} exited with {code}", code)
        probe = max(0.1, min(1.0, deadline - time.monotonic()))
        if listens(pid, launch.port) and healthy(launch.host, launch.port, launch.health, probe):
            return launch.url
        if time.monotonic() >= deadline:
            raise error(f"{launch.program} did not serve within {timeout:g}s", None)
        time.sleep(POLL_INTERVAL)


_running: weakref.WeakSet[ServerProcess] = weakref.WeakSet()


@atexit.register
def _stop_leftovers() -> None:
    # A server outlives its starter, as the real one does; a test process that ends normally
    # still takes the ones it started (and did not stop) with it.
    for server in list(_running):
        with contextlib.suppress(Exception):
            server.kill()


class ServerProcess(Generic[SpecT]):
    """A simulated server as a child process, started from its part of the host file (`spec`);
    start() and stop() as often as needed.

    start() returns once the server serves and sets `url`; a port 0 gets a free port at the
    first start and keeps it for the next (`listen` then names it). Its stdout and stderr
    are kept in `stdout_lines` and `stderr_lines`. What it runs is the subclass's `launch`.
    """

    error: ClassVar[type[ServerStartError]] = ServerStartError
    section: ClassVar[str] = "server"
    """The host file's part it is started from, for the messages about its `listen`."""

    def __init__(
        self,
        spec: SpecT,
        state_dir: Path,
        *,
        env: dict[str, str] | None = None,
        timeout: float = 30.0,
    ) -> None:
        self.spec = spec
        self.state_dir = state_dir
        self.env = env
        self.timeout = timeout
        self.listen = spec.listen
        self.popen: subprocess.Popen[str] | None = None
        self.url: str | None = None
        self.stdout_lines: list[str] = []
        self.stderr_lines: list[str] = []
        self._started: Launch | None = None
        self._readers: list[threading.Thread] = []

    def launch(self, spec: SpecT) -> Launch:
        """What runs `spec` (its port chosen already, when it was 0)."""
        raise NotImplementedError

    @property
    def pid(self) -> int:
        assert self.popen is not None, "not started"
        return self.popen.pid

    @property
    def returncode(self) -> int | None:
        return None if self.popen is None else self.popen.poll()

    def spawn(self) -> Self:
        """Start the process without waiting for it to serve."""
        self.url = None
        self.stdout_lines, self.stderr_lines = [], []
        self.listen = with_free_port(self.listen, self.section)
        self._started = self.launch(attrs.evolve(self.spec, listen=self.listen))
        self.popen = subprocess.Popen(
            self._started.argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            errors="replace",
            bufsize=1,
            env=self._started.env,
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

    def wait_serving(self, timeout: float | None = None) -> str:
        """The server's URL once it serves; `error` (its last stderr lines in the message) if
        it exits first."""
        assert self.popen is not None and self._started is not None, "not started"
        try:
            self.url = wait_serving(
                self._started,
                self.popen.pid,
                self.popen.poll,
                self.timeout if timeout is None else timeout,
                self.error,
            )
        except ServerStartError as exc:
            if exc.returncode is None:
                raise
            # The process has exited: its output ends, so the readers finish.
            self._join_readers()
            raise self.error(
                f"{exc}: {' | '.join(self.stderr_lines[-4:])}", exc.returncode
            ) from None
        return self.url

    def start(self) -> str:
        """spawn() and wait_serving(); the URL."""
        return self.spawn().wait_serving()

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
        return self.wait(READ_JOIN)

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _join_readers(self) -> None:
        for reader in self._readers:
            reader.join(timeout=READ_JOIN)


def _collect(stream: IO[str] | None, lines: list[str]) -> None:
    assert stream is not None
    with contextlib.suppress(OSError, ValueError):
        for line in stream:
            lines.append(line.rstrip("\n"))
