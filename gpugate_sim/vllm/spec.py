"""The `vllm:` section of HOST.yaml: a simulated `vllm serve MODEL`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import attrs

from gpugate.core.units import MiB
from gpugate_sim.specfields import duration, field_size, number, only

RUNNERS = ("auto", "generate", "pooling")
DEV_MODE_ENV = "VLLM_SERVER_DEV_MODE"


@attrs.frozen
class VllmServerSpec:
    """A simulated vLLM OpenAI-compatible server: one model, a fraction of the card."""

    listen: str = "127.0.0.1:8000"
    model: str = "Qwen/Qwen3-0.6B"
    served_model_names: tuple[str, ...] = ()
    """--served-model-name (empty: the model's path, as vLLM answers it)."""
    gpu: int | None = None
    """The host GPU it runs on (`--sim-gpu`); None: the first one its CUDA_VISIBLE_DEVICES
    shows (GPU 0 without one), as a real vLLM's `cuda:0`."""
    gpu_memory_utilization: float = 0.9
    max_model_len: int | None = None
    enable_sleep_mode: bool = False
    dev_mode: bool = False
    """VLLM_SERVER_DEV_MODE=1 in the server's environment: the /sleep family of routes."""
    runner: str = "auto"
    """--runner: `pooling` serves /v1/embeddings, the others the generation routes."""
    weights: int = 1200 * MiB
    """VRAM of the model's weights (a sleep-mode allocation tagged `weights`)."""
    context: int = 500 * MiB
    """The CUDA context, created before the free-memory check."""
    overhead: int = 512 * MiB
    """Activations kept by PyTorch's caching allocator and CUDA graphs: outside the sleep
    pool, so still held while asleep (with `context`: the residual)."""
    model_len: int = 8192
    """The model's own context length: max_model_len when none is given."""
    kv_bytes_per_token: int = 0
    """KV cache per token of context; 0 skips vLLM's max_model_len fit check."""
    load_seconds: float = 0.0
    """Reading the weights (a cold start, and reload_weights after a level-2 sleep)."""
    init_seconds: float = 0.0
    """Profiling, KV cache set-up, compilation and CUDA-graph capture after the load."""
    sleep_seconds: float = 0.0
    wake_seconds: float = 0.0
    """Copying level-1 weights back from CPU memory."""
    tokens_per_second: float = 200.0
    version: str = "0.33.0"

    def served_names(self) -> tuple[str, ...]:
        return self.served_model_names or (self.model,)


def parse_vllm(data: Any, base: Path = Path()) -> VllmServerSpec:
    """Read the `vllm:` mapping; ValueError naming the field."""
    del base  # no file paths in this section (yet); the signature matches whisper's
    fields = {f.name for f in attrs.fields(VllmServerSpec)}
    only(data, "vllm", fields)
    default = VllmServerSpec()
    listen = str(data.get("listen", default.listen))
    _, sep, port = listen.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"vllm.listen: expected HOST:PORT, got {listen!r}")
    names = data.get("served_model_names") or ()
    if isinstance(names, str):
        names = (names,)
    if not isinstance(names, list | tuple) or not all(isinstance(n, str) for n in names):
        raise ValueError("vllm.served_model_names: expected a list of names")
    runner = str(data.get("runner", "auto"))
    if runner not in RUNNERS:
        raise ValueError(f"vllm.runner: expected one of {', '.join(RUNNERS)}, got {runner!r}")
    util = number(data, "gpu_memory_utilization", "vllm", float, 0.9, positive=True)
    if util > 1:
        raise ValueError(f"vllm.gpu_memory_utilization: at most 1, got {util!r}")
    max_len = data.get("max_model_len")
    flags = {}
    for key in ("enable_sleep_mode", "dev_mode"):
        value = data.get(key, False)
        if not isinstance(value, bool):
            raise ValueError(f"vllm.{key}: expected true or false, got {value!r}")
        flags[key] = value
    return VllmServerSpec(
        listen=listen,
        model=str(data.get("model", default.model)),
        served_model_names=tuple(names),
        gpu=None if data.get("gpu") is None else number(data, "gpu", "vllm", int, 0, minimum=0),
        gpu_memory_utilization=util,
        max_model_len=None
        if max_len is None
        else number(data, "max_model_len", "vllm", int, 0, positive=True),
        runner=runner,
        weights=field_size(data, "weights", "vllm", default.weights),
        context=field_size(data, "context", "vllm", default.context),
        overhead=field_size(data, "overhead", "vllm", default.overhead),
        model_len=number(data, "model_len", "vllm", int, default.model_len, positive=True),
        kv_bytes_per_token=field_size(data, "kv_bytes_per_token", "vllm", 0),
        load_seconds=duration(data, "load_seconds", "vllm", 0.0),
        init_seconds=duration(data, "init_seconds", "vllm", 0.0),
        sleep_seconds=duration(data, "sleep_seconds", "vllm", 0.0),
        wake_seconds=duration(data, "wake_seconds", "vllm", 0.0),
        tokens_per_second=number(
            data, "tokens_per_second", "vllm", float, default.tokens_per_second, positive=True
        ),
        version=str(data.get("version", default.version)),
        **flags,
    )
