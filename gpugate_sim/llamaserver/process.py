"""Starting and stopping a simulated llama-server: its argv, and `SimLlamaServer`.

llama-server binds its port before it loads its model, so a starter learns it is up from
`GET /health` answering 200 (503 `Loading model` meanwhile; serverprocess.py); a router
answers 200 at once.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from gpugate_sim.llamaserver.spec import LlamaServerSpec
from gpugate_sim.serverprocess import (
    Launch,
    ServerProcess,
    ServerStartError,
    child_env,
    split_listen,
)

MODULE = "gpugate_sim.llamaserver"
SECTION = "llamaserver"
"""The host file's part a llama-server is read from."""


class LlamaServerStartError(ServerStartError):
    """The llama-server exited (or stayed unhealthy) before it served."""


def llamaserver_argv(
    spec: LlamaServerSpec, state_dir: Path | None = None, *, python: str = sys.executable
) -> list[str]:
    """The command that runs `spec`: llama-server's own options, then the `--sim-*` ones."""
    host, port = split_listen(spec.listen, SECTION)
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


def llamaserver_launch(
    spec: LlamaServerSpec, state_dir: Path | None, env: dict[str, str] | None = None
) -> Launch:
    """What runs `spec` (on its port, not 0) with `env`."""
    host, port = split_listen(spec.listen, SECTION)
    return Launch("llama-server", llamaserver_argv(spec, state_dir), child_env(env), host, port)


class SimLlamaServer(ServerProcess[LlamaServerSpec]):
    """A simulated llama-server as a child process: start() returns the URL once /health
    answers 200 (its model loaded; a router at once)."""

    error = LlamaServerStartError
    section = SECTION

    def launch(self, spec: LlamaServerSpec) -> Launch:
        return llamaserver_launch(spec, self.state_dir, self.env)


__all__ = ["LlamaServerStartError", "SimLlamaServer", "llamaserver_argv", "llamaserver_launch"]
