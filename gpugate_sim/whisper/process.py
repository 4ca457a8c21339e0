"""Starting and stopping a simulated whisper-server process: its argv, and `SimWhisper`.

whisper-server says it listens only in a stdout line that a pipe sees at its exit (C's
buffering), so a starter learns it is up from the port (serverprocess.py): it binds only
once the model is loaded, and `GET /health` under its request path then answers 200.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from gpugate_sim.serverprocess import (
    Launch,
    ServerProcess,
    ServerStartError,
    child_env,
    split_listen,
)
from gpugate_sim.whisper.spec import WhisperServerSpec

MODULE = "gpugate_sim.whisper"
SECTION = "whisper"
"""The host file's part a whisper-server is read from."""


def whisper_argv(
    spec: WhisperServerSpec, state_dir: Path | None = None, *, python: str = sys.executable
) -> list[str]:
    """The command that runs `spec`: whisper-server's own options, then the `--sim-*` ones."""
    host, port = split_listen(spec.listen, SECTION)
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


def whisper_launch(
    spec: WhisperServerSpec, state_dir: Path | None, env: dict[str, str] | None = None
) -> Launch:
    """What runs `spec` (on its port, not 0) with `env`, and its health route."""
    host, port = split_listen(spec.listen, SECTION)
    return Launch(
        "whisper-server",
        whisper_argv(spec, state_dir),
        child_env(env),
        host,
        port,
        health=spec.request_path + "/health",
    )


class WhisperStartError(ServerStartError):
    """The whisper-server exited (or stayed silent) before it listened."""


class SimWhisper(ServerProcess[WhisperServerSpec]):
    """A simulated whisper-server as a child process; start() and stop() as often as needed.

    start() returns once the server answers /health (its model is in VRAM by then). Its
    stdout is mostly seen at its exit (C buffering); a restart keeps the port chosen for
    port 0: the same server, again.
    """

    error = WhisperStartError
    section = SECTION

    def launch(self, spec: WhisperServerSpec) -> Launch:
        return whisper_launch(spec, self.state_dir, self.env)
