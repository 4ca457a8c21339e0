"""The `llamaserver:` section of HOST.yaml: a simulated llama.cpp llama-server.

llamaserver:
  listen: 127.0.0.1:8082
  model: models/qwen2.5-7b-instruct-q4_k_m.gguf   # single-model mode (-m), or:
  models_dir: models/llama                         # router mode (--models-dir)
  models_max: 4
  models_autoload: true
  ctx_size: 8192            # -c (absent: the model's own context, fitted to free memory)
  n_gpu_layers: auto        # -ngl: auto, all or a number
  gpu: 0                    # -dev CUDA<gpu>; `none` keeps everything off the GPU
  embeddings: false
  args: []                  # more llama-server options, passed as they are
  models:                   # sim only: a model file's weights on the GPU, by file name or
    alpha.gguf: 3GiB        # path (the file's own tensors otherwise; --sim-model-size)
  load_seconds: 1s
  tokens_per_second: 500
  record: llamaserver.jsonl # optional: a JSON line per model load
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import attrs

from gpugate_sim.specfields import duration, field_size, number, only, record_path


@attrs.frozen
class LlamaServerSpec:
    """A simulated llama-server, single-model (`model`) or router (`models_dir`)."""

    listen: str = "127.0.0.1:8082"
    model: str | None = None
    models_dir: str | None = None
    models_max: int = 4
    models_autoload: bool = True
    ctx_size: int | None = None
    n_gpu_layers: str = "auto"
    gpu: int | None = 0
    """None: `-dev none`."""
    embeddings: bool = False
    args: tuple[str, ...] = ()
    models: dict[str, int] = attrs.field(factory=dict)
    """Model files (file name or path) → their weights on the simulated GPU."""
    load_seconds: float = 0.0
    tokens_per_second: float = 500.0
    record: Path | None = None


def parse_llamaserver(data: Any, base: Path = Path()) -> LlamaServerSpec:
    """Read the `llamaserver:` mapping; ValueError naming the field. Relative model paths
    and `record` start from `base`, the host file's directory."""
    fields = {f.name for f in attrs.fields(LlamaServerSpec)}
    only(data, "llamaserver", fields)
    model, models_dir = data.get("model"), data.get("models_dir")
    if (model is None) == (models_dir is None):
        raise ValueError("llamaserver: give exactly one of model and models_dir")
    listen = str(data.get("listen", attrs.fields(LlamaServerSpec).listen.default))
    _, sep, port = listen.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"llamaserver.listen: expected HOST:PORT, got {listen!r}")
    for key in ("models_autoload", "embeddings"):
        if not isinstance(data.get(key, False), bool):
            raise ValueError(f"llamaserver.{key}: expected true or false")
    args = data.get("args") or []
    if not isinstance(args, list):
        raise ValueError("llamaserver.args: expected a list of words")
    models = data.get("models") or {}
    if not isinstance(models, dict):
        raise ValueError("llamaserver.models: expected a mapping of model file to size")
    sizes = {str(name): field_size(models, name, "llamaserver.models", 0) for name in models}
    gpu = data.get("gpu", 0)
    ctx = data.get("ctx_size")
    return LlamaServerSpec(
        listen=listen,
        model=None if model is None else str(base / str(model)),
        models_dir=None if models_dir is None else str(base / str(models_dir)),
        models_max=number(data, "models_max", "llamaserver", int, 4, minimum=0),
        models_autoload=bool(data.get("models_autoload", True)),
        ctx_size=None
        if ctx is None
        else number(data, "ctx_size", "llamaserver", int, 0, minimum=0),
        n_gpu_layers=str(data.get("n_gpu_layers", "auto")),
        gpu=None if gpu == "none" else number(data, "gpu", "llamaserver", int, 0, minimum=0),
        embeddings=bool(data.get("embeddings", False)),
        args=tuple(str(a) for a in args),
        models=sizes,
        load_seconds=duration(data, "load_seconds", "llamaserver", 0.0),
        tokens_per_second=number(
            data, "tokens_per_second", "llamaserver", float, 500.0, positive=True
        ),
        record=record_path(data, "llamaserver", base),
    )
