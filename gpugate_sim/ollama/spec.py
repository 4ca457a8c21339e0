"""The `ollama:` section of HOST.yaml: a simulated Ollama, the GPUs it sees, its models.

ollama:
  listen: 127.0.0.1:11435
  gpus: [0, 1]              # the host GPUs it sees (CUDA_VISIBLE_DEVICES); or gpu: N;
                            # neither: every GPU of the host
  sched_spread: false       # OLLAMA_SCHED_SPREAD
  keep_alive: 5m
  models:
    - {name: gemma3:12b, size: 7796MiB, block_count: 48, load_seconds: 2s}
    - {name: qwen2.5:7b, family: qwen2, block_count: 28, embedding_length: 3584,
       feed_forward_length: 18944, head_count: 28, head_count_kv: 4, vocab_size: 152064}
  preload:
    - {model: gemma3:12b, keep_alive: 24h}
  record: readings.jsonl     # one line per request a loading route read (record.py)

The fields are listed in docs/runtimes/ollama.md.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import attrs

from gpugate.core.units import MiB, parse_duration
from gpugate_sim.faultspec import FaultSpec, parse_faults
from gpugate_sim.specfields import field_size as _field_size
from gpugate_sim.specfields import number as _number
from gpugate_sim.specfields import only as _only
from gpugate_sim.specfields import record_path

DEFAULT_MODELS_PER_GPU = 3
"""server/sched.go `defaultModelsPerGPU`: OLLAMA_MAX_LOADED_MODELS unset allows 3 per GPU."""


@attrs.frozen
class OllamaModelSpec:
    """A model the simulated Ollama has on disk."""

    name: str
    size: int = 0
    """VRAM the runner holds with default options, given (weights, KV cache and overhead as
    one number). 0: what the llama-server Ollama starts holds for the model's shape."""
    load_seconds: float = 0.5
    context_length: int = 8192
    """Training context; num_ctx above it is capped."""
    default_num_ctx: int = 4096
    kv_bytes_per_token: int = 0
    """KV cache bytes per token of context; num_ctx changes the runner's size by this."""
    embedding: bool = False
    family: str = "llama"
    parameter_size: str = ""
    quantization_level: str = "Q4_K_M"
    digest: str = ""
    file_size: int = 0
    """Bytes on disk (/api/tags `size`); 0: the runner size without the default KV cache."""
    embedding_length: int = 16
    """Dimension of the deterministic embedding vectors."""
    block_count: int = 32
    """Layers; `num_gpu: N` below this puts N/block_count of the model on the GPU."""
    head_count: int = 0
    """Attention heads (0: the shape is not given: no GGUF blob is written, and `size`
    must be). With the dimensions below, the blob's header and /api/show's model_info and
    tensors describe the model (blobs.py), and a load holds what llama-server holds for
    it (runners.py)."""
    head_count_kv: int = 0
    vocab_size: int = 0
    feed_forward_length: int = 0
    """The feed-forward width (0: 4 × embedding_length)."""
    key_length: int = 0
    """Each head's key and value width (0: embedding_length / head_count)."""
    sliding_window: int = 0
    """The window of the architecture's sliding-window layers (gemma3: 5 of every 6)."""
    tied_embeddings: bool = False
    """No output matrix: the token embeddings serve as one."""
    tokens_per_second: float | None = None
    """Overrides the server's token rate for this model."""


@attrs.frozen
class PreloadSpec:
    model: str
    keep_alive: str = "5m"
    options: dict[str, Any] = attrs.field(factory=dict)


@attrs.frozen
class OllamaSpec:
    """The `ollama:` section: one simulated Ollama server and the models it has."""

    listen: str = "127.0.0.1:11435"
    gpu: int | None = None
    """`gpu: N`: Ollama sees that one host GPU (as with CUDA_VISIBLE_DEVICES=N)."""
    gpus: tuple[int, ...] | None = None
    """The host GPUs Ollama sees, in its device order (CUDA_VISIBLE_DEVICES=0,1). Neither
    this nor `gpu`: every GPU of the host."""
    sched_spread: bool = False
    """OLLAMA_SCHED_SPREAD: spread every model across all GPUs instead of fitting it on one."""
    keep_alive: str = "5m"
    """OLLAMA_KEEP_ALIVE: the duration a load gets when the request carries none."""
    tokens_per_second: float = 200.0
    version: str = "0.33.0"
    max_queue: int = 512
    """OLLAMA_MAX_QUEUE: pending loads beyond this are answered 503."""
    num_parallel: int = 1
    """OLLAMA_NUM_PARALLEL: requests one loaded model serves at once, each with a context of
    its own (embedding models: 1). Its default is 1 (envconfig/config.go)."""
    context_length: int = 0
    """OLLAMA_CONTEXT_LENGTH: the context of a request that sets none (0: by the VRAM of
    the GPUs Ollama sees, for a model with a shape)."""
    max_loaded_models: int | None = None
    """OLLAMA_MAX_LOADED_MODELS: loading one more evicts one first. None: 3 per GPU Ollama
    sees (Ollama's default, `defaultModelsPerGPU`)."""
    fit_margin: int = 256 * MiB
    """VRAM left free when a model only partly fits (llama-server's fit target)."""
    origins: tuple[str, ...] = ()
    """OLLAMA_ORIGINS: extra CORS origins (`*` wildcards allowed)."""
    models: tuple[OllamaModelSpec, ...] = ()
    preload: tuple[PreloadSpec, ...] = ()
    faults: FaultSpec = attrs.field(factory=FaultSpec)
    """Faults switched on from the start (gpugate_sim.ollama.faults)."""
    record: Path | None = None
    """A file to append each loading route's reading of a request to (record.py)."""

    def devices(self, host_gpus: int) -> tuple[int, ...]:
        """The host GPUs this Ollama sees, in its order, on a host with `host_gpus` GPUs."""
        if self.gpus is not None:
            return self.gpus
        if self.gpu is not None:
            return (self.gpu,)
        return tuple(range(host_gpus))

    def loaded_limit(self, gpus: int) -> int:
        """How many runners may be loaded at once with `gpus` GPUs seen."""
        if self.max_loaded_models is not None:
            return self.max_loaded_models
        return DEFAULT_MODELS_PER_GPU * max(gpus, 1)


def parse_ollama(data: dict[str, Any], base: Path | None = None) -> OllamaSpec:
    """Read the `ollama:` mapping; ValueError naming the field. A relative `record` is
    taken from `base` (the host file's directory)."""
    # Imported here: they are only needed to read a host file, not by the runner child.
    from gpugate_sim.ollama.duration import DurationError, parse_keep_alive_setting
    from gpugate_sim.ollama.names import ModelName

    simple = {"listen", "gpu", "gpus", "keep_alive", "tokens_per_second", "version", "max_queue"}
    knobs = {"num_parallel", "max_loaded_models", "fit_margin", "origins", "sched_spread",
             "context_length"}  # fmt: skip
    _only(data, "ollama", simple | knobs | {"models", "preload", "faults", "record"})

    def keep_alive(value: Any, where: str) -> str:
        try:
            parse_keep_alive_setting(value)
        except DurationError as exc:
            raise ValueError(f"{where}: {exc}") from None
        return str(value)

    models = tuple(_model(m, f"ollama.models[{i}]") for i, m in enumerate(data.get("models") or []))
    keys: list[str] = []
    for i, m in enumerate(models):
        name = ModelName.parse(m.name)
        if name is None:
            raise ValueError(f"ollama.models[{i}].name: invalid model name {m.name!r}")
        if name.key in keys:
            raise ValueError(f"ollama.models[{i}].name: {m.name!r} is listed twice")
        keys.append(name.key)
    preload = []
    for i, p in enumerate(data.get("preload") or []):
        where = f"ollama.preload[{i}]"
        _only(p, where, {"model", "keep_alive", "options"})
        if "model" not in p:
            raise ValueError(f"{where}.model: missing")
        wanted = ModelName.parse(str(p["model"]))
        if wanted is None or wanted.key not in keys:
            raise ValueError(f"{where}.model: {p['model']!r} is not one of ollama.models")
        options = p.get("options") or {}
        if not isinstance(options, dict):
            raise ValueError(f"{where}.options: expected a mapping")
        preload.append(
            PreloadSpec(
                str(p["model"]),
                keep_alive(p.get("keep_alive", "5m"), f"{where}.keep_alive"),
                dict(options),
            )
        )
    default = {f.name: f.default for f in attrs.fields(OllamaSpec)}
    origins = data.get("origins") or ()
    if isinstance(origins, str):
        origins = [o.strip() for o in origins.split(",") if o.strip()]
    if not isinstance(origins, list | tuple) or not all(isinstance(o, str) for o in origins):
        raise ValueError("ollama.origins: expected a list of origins or a comma-separated string")
    gpu = None if data.get("gpu") is None else _number(data, "gpu", "ollama", int, 0, minimum=0)
    return OllamaSpec(
        listen=str(data.get("listen", default["listen"])),
        gpu=gpu,
        gpus=_gpus(data),
        sched_spread=_flag(data, "sched_spread"),
        keep_alive=keep_alive(data.get("keep_alive", "5m"), "ollama.keep_alive"),
        tokens_per_second=_number(
            data, "tokens_per_second", "ollama", float, default["tokens_per_second"], positive=True
        ),
        version=str(data.get("version", default["version"])),
        max_queue=_number(data, "max_queue", "ollama", int, default["max_queue"], minimum=0),
        num_parallel=_number(
            data, "num_parallel", "ollama", int, default["num_parallel"], minimum=1
        ),
        context_length=_number(data, "context_length", "ollama", int, 0, minimum=0),
        max_loaded_models=None
        if data.get("max_loaded_models") is None
        else _number(data, "max_loaded_models", "ollama", int, 3, minimum=1),
        fit_margin=_field_size(data, "fit_margin", "ollama", default["fit_margin"]),
        origins=tuple(origins),
        models=models,
        preload=tuple(preload),
        faults=parse_faults(data.get("faults")),
        record=record_path(data, "ollama", base or Path()),
    )


def _model(data: Any, where: str) -> OllamaModelSpec:
    _only(data, where, {f.name for f in attrs.fields(OllamaModelSpec)})
    if "name" not in data or ("size" not in data and not data.get("head_count")):
        raise ValueError(f"{where}: 'name' and 'size' (or the model's shape) are required")
    default = {f.name: f.default for f in attrs.fields(OllamaModelSpec)}
    load_seconds = data.get("load_seconds", default["load_seconds"])
    try:
        load_seconds = parse_duration(load_seconds)
    except ValueError as exc:
        raise ValueError(f"{where}.load_seconds: {exc}") from None
    rate = data.get("tokens_per_second")
    embedding = data.get("embedding", False)
    if not isinstance(embedding, bool):
        raise ValueError(f"{where}.embedding: expected true or false, got {embedding!r}")
    spec = OllamaModelSpec(
        name=str(data["name"]),
        size=_field_size(data, "size", where, 0),
        load_seconds=load_seconds,
        context_length=_number(
            data, "context_length", where, int, default["context_length"], minimum=1
        ),
        default_num_ctx=_number(
            data, "default_num_ctx", where, int, default["default_num_ctx"], minimum=1
        ),
        kv_bytes_per_token=_field_size(data, "kv_bytes_per_token", where, 0),
        embedding=embedding,
        family=str(data.get("family", default["family"])),
        parameter_size=str(data.get("parameter_size", "")),
        quantization_level=str(data.get("quantization_level", default["quantization_level"])),
        digest=str(data.get("digest", "")),
        file_size=_field_size(data, "file_size", where, 0),
        embedding_length=_number(
            data, "embedding_length", where, int, default["embedding_length"], minimum=1
        ),
        block_count=_number(data, "block_count", where, int, default["block_count"], minimum=1),
        head_count=_number(data, "head_count", where, int, 0, minimum=0),
        head_count_kv=_number(data, "head_count_kv", where, int, 0, minimum=0),
        vocab_size=_number(data, "vocab_size", where, int, 0, minimum=0),
        feed_forward_length=_number(data, "feed_forward_length", where, int, 0, minimum=0),
        key_length=_number(data, "key_length", where, int, 0, minimum=0),
        sliding_window=_number(data, "sliding_window", where, int, 0, minimum=0),
        tied_embeddings=_boolean(data, "tied_embeddings", where),
        tokens_per_second=None
        if rate is None
        else _number(data, "tokens_per_second", where, float, 0.0, positive=True),
    )
    if spec.default_num_ctx > spec.context_length:
        raise ValueError(
            f"{where}.default_num_ctx: {spec.default_num_ctx} is above context_length "
            f"{spec.context_length}"
        )
    return spec


def _gpus(data: dict[str, Any]) -> tuple[int, ...] | None:
    value = data.get("gpus")
    if value is None:
        return None
    if data.get("gpu") is not None:
        raise ValueError("ollama: give gpu or gpus, not both")
    if not isinstance(value, list) or not value:
        raise ValueError(f"ollama.gpus: expected a non-empty list of GPU indexes, got {value!r}")
    gpus = []
    for i, gpu in enumerate(value):
        if isinstance(gpu, bool) or not isinstance(gpu, int) or gpu < 0:
            raise ValueError(f"ollama.gpus[{i}]: expected a GPU index, got {gpu!r}")
        if gpu in gpus:
            raise ValueError(f"ollama.gpus[{i}]: GPU {gpu} is listed twice")
        gpus.append(gpu)
    return tuple(gpus)


def _boolean(data: dict[str, Any], key: str, where: str) -> bool:
    value = data.get(key, False)
    if not isinstance(value, bool):
        raise ValueError(f"{where}.{key}: expected true or false, got {value!r}")
    return value


def _flag(data: dict[str, Any], key: str) -> bool:
    value = data.get(key, False)
    if not isinstance(value, bool):
        raise ValueError(f"ollama.{key}: expected true or false, got {value!r}")
    return value
