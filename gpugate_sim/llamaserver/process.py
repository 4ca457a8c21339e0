"""Starting and stopping a simulated llama-server: its argv, and `SimLlamaServer`.

llama-server binds its port before it loads its model, so a starter learns it is up from
`GET /health` answering 200 (503 `Loading model` meanwhile); a router answers 200 at once.
"""

from __future__ import annotations

import contextlib
import http.client
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from gpugate_sim.llamaserver.spec import LlamaServerSpec
from gpugate_sim.whisper.process import child_env, split_listen, with_port

MODULE = "gpugate_sim.llamaserver"
POLL_INTERVAL = 0.02


class LlamaServerStartError(RuntimeError):
    """The process exited (or stayed unhealthy) before it served; `returncode` says how."""

    def __init__(self, message: str, returncode: int | None) -> None:
        super().__init__(message)
        self.returncode = returncode


def llamaserver_argv(
    spec: LlamaServerSpec, state_dir: Path | None = None, *, python: str = sys.executable
) -> list[str]:
    """The command that runs `spec`: llama-server's own options, then the `--sim-*` ones."""
    host, port = split_listen(spec.listen)
    argv = [python, "-m", MODULE]
    if spec.model is not None:
        argv += ["-m", spec.model]
    else:
        argv += ["--models-dir", str(spec.models_dir), "--models-max", str(spec.models_max)]
        if not spec.models_autoload:
            argv.append("--no-models-autoload")
    argv += ["--host", host, "--port", str(port)]
    if spec.ctx_size is not None:
        argv += ["-c", str(spec.ctx_size)]
    if spec.n_gpu_layers != "auto":
        argv += ["-ngl", spec.n_gpu_layers]
    argv += ["-dev", "none" if spec.gpu is None else f"CUDA{spec.gpu}"]
    if spec.embeddings:
        argv.append("--embeddings")
    argv += list(spec.args)
    if state_dir is not None:
        argv += ["--sim-state-dir", str(state_dir)]
    for name, size in spec.models.items():
        argv += ["--sim-model-size", f"{name}={size}"]
    if spec.record is not None:
        argv += ["--sim-record", os.path.abspath(spec.record)]
    return [*argv, "--sim-load-seconds", repr(spec.load_seconds),
            "--sim-tokens-per-second", repr(spec.tokens_per_second)]  # fmt: skip


def healthy(host: str, port: int, timeout: float = 1.0) -> bool:
    """Whether `GET /health` answers 200."""
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        conn.request("GET", "/health")
        return conn.getresponse().status == 200
    except (OSError, http.client.HTTPException):
        return False
    finally:
        conn.close()


def wait_healthy(spec: LlamaServerSpec, popen: subprocess.Popen[bytes], timeout: float) -> str:
    """The URL once `/health` answers 200; LlamaServerStartError if the process exits first."""
    host, port = split_listen(spec.listen)
    deadline = time.monotonic() + timeout
    while True:
        code = popen.poll()
        if code is not None:
            raise LlamaServerStartError(f"llama-server exited with {code}", code)
        if healthy(host, port):
            return f"http://{host}:{port}"
        if time.monotonic() >= deadline:
            raise LlamaServerStartError("llama-server did not become healthy in time", None)
        time.sleep(POLL_INTERVAL)


class SimLlamaServer:
    """A simulated llama-server as a child process (stdout and stderr to files in
    `log_dir`, or discarded): start() returns the URL once it is healthy."""

    def __init__(
        self, spec: LlamaServerSpec, state_dir: Path, *, timeout: float = 30.0,
        log_dir: Path | None = None,
    ) -> None:  # fmt: skip
        self.spec = with_port(spec)  # type: ignore[arg-type]
        self.state_dir = state_dir
        self.timeout = timeout
        self.log_dir = log_dir
        self.popen: subprocess.Popen[bytes] | None = None
        self.url: str | None = None

    @property
    def pid(self) -> int:
        assert self.popen is not None, "not started"
        return self.popen.pid

    def spawn(self) -> SimLlamaServer:
        out = subprocess.DEVNULL if self.log_dir is None else open(self.log_dir / "llama.log", "ab")  # noqa: SIM115
        self.popen = subprocess.Popen(
            llamaserver_argv(self.spec, self.state_dir), stdin=subprocess.DEVNULL,
            stdout=out, stderr=out, env=child_env(),
        )  # fmt: skip
        return self

    def start(self) -> str:
        """spawn() and wait until healthy; the URL."""
        self.spawn()
        assert self.popen is not None
        self.url = wait_healthy(self.spec, self.popen, self.timeout)
        return self.url

    def stop(self, timeout: float = 15.0) -> int | None:
        """SIGTERM (SIGKILL after `timeout` seconds); the exit code."""
        if self.popen is None:
            return None
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
        try:
            return self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            return self.popen.wait(timeout)

    def kill(self) -> int | None:
        """SIGKILL and reap; the exit code."""
        if self.popen is None:
            return None
        with contextlib.suppress(ProcessLookupError):
            self.popen.kill()
        return self.popen.wait(10)


__all__ = ["LlamaServerStartError", "SimLlamaServer", "llamaserver_argv", "wait_healthy"]
