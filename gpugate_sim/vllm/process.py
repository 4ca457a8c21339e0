"""Starting and stopping a simulated `vllm serve` process: its argv, and `SimVllm`.

vLLM binds its port before the engine starts but listens only once the engine is up, so
a starter learns it is up from the port (serverprocess.py): the process listens on it and
`GET /health` answers 200.
"""

from __future__ import annotations

import sys
from pathlib import Path

from gpugate_sim.serverprocess import (
    Launch,
    ServerProcess,
    ServerStartError,
    child_env,
    split_listen,
)
from gpugate_sim.vllm.spec import DEV_MODE_ENV, VllmServerSpec

MODULE = "gpugate_sim.vllm"
SECTION = "vllm"
"""The host file's part a vLLM server is read from."""


class VllmStartError(ServerStartError):
    """`vllm serve` exited (or stayed silent) before it served."""


def vllm_argv(
    spec: VllmServerSpec, state_dir: Path | None = None, *, python: str = sys.executable
) -> list[str]:
    """The command that runs `spec`: `vllm serve`'s own options, then the `--sim-*` ones."""
    host, port = split_listen(spec.listen, SECTION)
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
    """`base` with the simulator importable and VLLM_SERVER_DEV_MODE as the spec says."""
    env = child_env(base)
    if spec.dev_mode:
        env[DEV_MODE_ENV] = "1"
    else:
        env.pop(DEV_MODE_ENV, None)
    return env


def vllm_launch(
    spec: VllmServerSpec, state_dir: Path | None, env: dict[str, str] | None = None
) -> Launch:
    """What runs `spec` (on its port, not 0) with `env`."""
    host, port = split_listen(spec.listen, SECTION)
    return Launch("vllm serve", vllm_argv(spec, state_dir), vllm_env(spec, env), host, port)


class SimVllm(ServerProcess[VllmServerSpec]):
    """A simulated `vllm serve` as a child process: start() returns once /health answers
    (its memory is taken by then)."""

    error = VllmStartError
    section = SECTION

    def launch(self, spec: VllmServerSpec) -> Launch:
        return vllm_launch(spec, self.state_dir, self.env)


__all__ = ["SimVllm", "VllmStartError", "vllm_argv", "vllm_env", "vllm_launch"]
