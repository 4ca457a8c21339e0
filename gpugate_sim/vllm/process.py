"""Starting and stopping a simulated `vllm serve` process: its argv, and `SimVllm`.

vLLM binds its port before the engine starts but listens only once the engine is up, so
a starter learns it is up from the port: the process holds a listening socket on it and
`GET /health` answers 200. The socket is looked up in /proc because another server may
share the port (SO_REUSEPORT).
"""

from __future__ import annotations

import atexit
import contextlib
import http.client
import signal
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import IO

import attrs

from gpugate_sim.vllm.spec import DEV_MODE_ENV, VllmServerSpec
from gpugate_sim.whisper.process import child_env, free_port, listens

MODULE = "gpugate_sim.vllm"
POLL_INTERVAL = 0.02


class VllmStartError(RuntimeError):
    """The process exited (or stayed silent) before it served; `returncode` says how."""

    def __init__(self, message: str, returncode: int | None) -> None:
        super().__init__(message)
        self.returncode = returncode


def split_listen(listen: str) -> tuple[str, int]:
    host, sep, port = listen.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"vllm.listen: expected HOST:PORT, got {listen!r}")
    return host.strip("[]") or "127.0.0.1", int(port)


def with_port(spec: VllmServerSpec) -> VllmServerSpec:
    """`spec` with a port 0 replaced by a free one (vLLM would print 0 for it)."""
    host, port = split_listen(spec.listen)
    return spec if port else attrs.evolve(spec, listen=f"{host}:{free_port(host)}")


def vllm_argv(
    spec: VllmServerSpec, state_dir: Path | None = None, *, python: str = sys.executable
) -> list[str]:
    """The command that runs `spec`: `vllm serve`'s own options, then the `--sim-*` ones."""
    host, port = split_listen(spec.listen)
    argv = [python, "-m", MODULE, "serve", spec.model, "--host", host, "--port", str(port)]
    if spec.served_model_names:
        argv += ["--served-model-name", *spec.served_model_names]
    if spec.gpu_memory_utilization != 0.9:
        argv += ["--gpu-memory-utilization", repr(spec.gpu_memory_utilization)]
    if spec.max_model_len is not None:
        argv += ["--max-model-len", str(spec.max_model_len)]
    if spec.enable_sleep_mode:
        argv.append("--enable-sleep-mode")
    if spec.runner != "auto":
        argv += ["--runner", spec.runner]
    if state_dir is not None:
        argv += ["--sim-state-dir", str(state_dir)]
    if spec.gpu is not None:
        argv += ["--sim-gpu", str(spec.gpu)]
    return [
        *argv,
        "--sim-weights", str(spec.weights),
        "--sim-context", str(spec.context),
        "--sim-overhead", str(spec.overhead),
        "--sim-model-len", str(spec.model_len),
        "--sim-kv-bytes-per-token", str(spec.kv_bytes_per_token),
        "--sim-load-seconds", repr(spec.load_seconds),
        "--sim-init-seconds", repr(spec.init_seconds),
        "--sim-sleep-seconds", repr(spec.sleep_seconds),
        "--sim-wake-seconds", repr(spec.wake_seconds),
        "--sim-tokens-per-second", repr(spec.tokens_per_second),
        "--sim-version", spec.version,
    ]  # fmt: skip


def vllm_env(spec: VllmServerSpec, base: dict[str, str] | None = None) -> dict[str, str]:
    """`base` with this checkout importable and VLLM_SERVER_DEV_MODE as the spec says."""
    env = child_env(base)
    if spec.dev_mode:
        env[DEV_MODE_ENV] = "1"
    else:
        env.pop(DEV_MODE_ENV, None)
    return env


def wait_serving(
    spec: VllmServerSpec, pid: int, exited: Callable[[], int | None], timeout: float
) -> str:
    """Block until process `pid` listens on `spec`'s port and /health answers 200; its URL.

    VllmStartError with the exit code as soon as `exited` says it has ended, or with None
    when `timeout` seconds pass first.
    """
    host, port = split_listen(spec.listen)
    deadline = time.monotonic() + timeout
    while True:
        code = exited()
        if code is not None:
            raise VllmStartError(f"vllm serve exited with {code}", code)
        if listens(pid, port) and _healthy(host, port):
            return f"http://{host}:{port}"
        if time.monotonic() >= deadline:
            raise VllmStartError("vllm serve did not listen in time", None)
        time.sleep(POLL_INTERVAL)


def _healthy(host: str, port: int) -> bool:
    conn = http.client.HTTPConnection(host, port, timeout=1.0)
    try:
        conn.request("GET", "/health")
        return conn.getresponse().status == 200
    except (OSError, http.client.HTTPException):
        return False
    finally:
        conn.close()


_running: weakref.WeakSet[SimVllm] = weakref.WeakSet()


@atexit.register
def _stop_leftovers() -> None:
    # A test process that ends normally takes the servers it left running with it.
    for sim in list(_running):
        with contextlib.suppress(Exception):
            sim.kill()


class SimVllm:
    """A simulated `vllm serve` as a child process.

    start() returns once /health answers (its memory is taken by then) and sets `url`; a
    spec on port 0 gets a free port first. stdout and stderr are kept in `stdout_lines`
    and `stderr_lines`.
    """

    def __init__(
        self,
        spec: VllmServerSpec,
        state_dir: Path,
        *,
        env: dict[str, str] | None = None,
        timeout: float = 30.0,
    ) -> None:
        self.spec = with_port(spec)
        self.state_dir = state_dir
        self.env = env
        self.timeout = timeout
        self.popen: subprocess.Popen[str] | None = None
        self.url: str | None = None
        self.stdout_lines: list[str] = []
        self.stderr_lines: list[str] = []
        self._readers: list[threading.Thread] = []

    @property
    def pid(self) -> int:
        assert self.popen is not None, "not started"
        return self.popen.pid

    def spawn(self) -> SimVllm:
        """Start the process without waiting for it to serve."""
        self.stdout_lines, self.stderr_lines = [], []
        self.popen = subprocess.Popen(
            vllm_argv(self.spec, self.state_dir),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            errors="replace",
            bufsize=1,
            env=vllm_env(self.spec, self.env),
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
        assert self.popen is not None, "not started"
        try:
            self.url = wait_serving(
                self.spec, self.popen.pid, self.popen.poll, timeout or self.timeout
            )
        except VllmStartError as exc:
            if exc.returncode is None:
                raise
            self._join_readers()
            raise VllmStartError(
                f"{exc}: {' | '.join(self.stderr_lines[-3:])}", exc.returncode
            ) from None
        return self.url

    def start(self) -> str:
        return self.spawn().wait_serving()

    def stop(self, timeout: float = 10.0) -> int | None:
        """SIGTERM (SIGKILL after `timeout` seconds); the exit code."""
        if self.popen is None:
            return None
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
        try:
            code = self.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            code = self.popen.wait(timeout=timeout)
        self._join_readers()
        return code

    def kill(self) -> int | None:
        if self.popen is None:
            return None
        if self.popen.poll() is None:
            self.popen.kill()
        return self.popen.wait(timeout=10.0)

    def __enter__(self) -> SimVllm:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _join_readers(self) -> None:
        for reader in self._readers:
            reader.join(timeout=10.0)


def _collect(stream: IO[str] | None, lines: list[str]) -> None:
    assert stream is not None
    with contextlib.suppress(OSError, ValueError):
        for line in stream:
            lines.append(line.rstrip("\n"))


__all__ = ["SimVllm", "VllmStartError", "vllm_argv", "vllm_env", "wait_serving", "with_port"]
