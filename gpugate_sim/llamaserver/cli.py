"""llama-server's command line (common/arg.cpp), as far as the simulator needs it.

Options that change what the simulator does are read; other real options are accepted
and ignored (with their value, if they take one), so a real command line runs unchanged;
anything else is refused as `common_params_parse` refuses it (`error: invalid argument:
X`, status 1). Environment variables (`LLAMA_ARG_*`) fill what the command line leaves.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import attrs

from gpugate.core.units import parse_duration, parse_size
from gpugate_sim.cuda import CudaDevices
from gpugate_sim.llamaserver.memory import FIT_MIN_CTX, FIT_TARGET, NGL_ALL, NGL_AUTO

# option words → attribute, for options that take a value.
_VALUED = {
    "-m": "model", "--model": "model",
    "--host": "host", "--port": "port",
    "-c": "ctx_size", "--ctx-size": "ctx_size",
    "-ngl": "n_gpu_layers", "--gpu-layers": "n_gpu_layers", "--n-gpu-layers": "n_gpu_layers",
    "-dev": "device", "--device": "device",
    "-a": "alias", "--alias": "alias",
    "-np": "parallel", "--parallel": "parallel",
    "-n": "n_predict", "--predict": "n_predict", "--n-predict": "n_predict",
    "-ub": "ubatch", "--ubatch-size": "ubatch",
    "-b": "batch", "--batch-size": "batch",
    "-fa": "flash_attn", "--flash-attn": "flash_attn",
    "-fit": "fit", "--fit": "fit",
    "-fitt": "fit_target", "--fit-target": "fit_target",
    "-fitc": "fit_ctx", "--fit-ctx": "fit_ctx",
    "--pooling": "pooling",
    "--models-dir": "models_dir", "--models-max": "models_max",
}  # fmt: skip
_FLAGS = {
    "--embedding": ("embeddings", True), "--embeddings": ("embeddings", True),
    "--models-autoload": ("models_autoload", True),
    "--no-models-autoload": ("models_autoload", False),
}  # fmt: skip
_IGNORED_VALUED = {
    "-t",
    "--threads",
    "-tb",
    "--threads-batch",
    "--temp",
    "--top-k",
    "--top-p",
    "--min-p",
    "--seed",
    "-s",
    "-ctk",
    "--cache-type-k",
    "-ctv",
    "--cache-type-v",
    "--keep",
    "-sm",
    "--split-mode",
    "-mg",
    "--main-gpu",
    "--chat-template",
    "--chat-template-file",
    "--api-key",
    "--timeout",
    "-to",
    "--threads-http",
    "--sleep-idle-seconds",
    "--cache-reuse",
    "--reasoning-format",
    "-lv",
    "--verbosity",
    "--log-verbosity",
    "--tags",
    "--path",
    "--api-prefix",
    "--models-preset",
    "-ts",
    "--tensor-split",
    "--rope-scaling",
    "--rope-freq-base",
    "--slot-save-path",
    "--media-path",
    "--log-file",
}
_IGNORED_FLAGS = {
    "--jinja",
    "--no-jinja",
    "--no-webui",
    "--webui",
    "--ui",
    "--no-ui",
    "--metrics",
    "--slots",
    "--no-slots",
    "--props",
    "--no-mmap",
    "--mlock",
    "--cont-batching",
    "--no-cont-batching",
    "--kv-unified",
    "--no-kv-unified",
    "--verbose",
    "-v",
    "--log-disable",
    "--reuse-port",
    "--no-warmup",
    "--no-perf",
    "--log-colors",
    "--offline",
    "--rerank",
    "--reranking",
    "-cb",
    "-nocb",
    "--swa-full",
}
_ENV = {
    "LLAMA_ARG_MODEL": "model", "LLAMA_ARG_HOST": "host", "LLAMA_ARG_PORT": "port",
    "LLAMA_ARG_CTX_SIZE": "ctx_size", "LLAMA_ARG_N_GPU_LAYERS": "n_gpu_layers",
    "LLAMA_ARG_DEVICE": "device", "LLAMA_ARG_ALIAS": "alias", "LLAMA_ARG_N_PARALLEL": "parallel",
    "LLAMA_ARG_MODELS_DIR": "models_dir", "LLAMA_ARG_MODELS_MAX": "models_max",
}  # fmt: skip


@attrs.define
class Args:
    """The parsed command line; the real option names, then the simulator's own."""

    model: str | None = None
    host: str = "127.0.0.1"
    port: int = 8080
    ctx_size: int | None = None
    n_gpu_layers: int = NGL_AUTO
    device: str | None = None
    alias: tuple[str, ...] = ()
    parallel: int = -1
    n_predict: int = -1
    ubatch: int = 512
    batch: int = 2048
    flash_attn: str = "auto"
    fit: bool = True
    fit_target: int = FIT_TARGET
    fit_ctx: int = FIT_MIN_CTX
    pooling: str | None = None
    embeddings: bool = False
    models_dir: str | None = None
    models_max: int = 4
    models_autoload: bool = True
    sim_state_dir: Path | None = None
    sim_gpu: int | None = None
    sim_load_seconds: float = 0.0
    sim_tokens_per_second: float = 500.0
    sim_prompt_tokens_per_second: float = 5000.0
    sim_eos_after: int = 16
    sim_record: Path | None = None
    sim_model_sizes: dict[str, int] = attrs.field(factory=dict)
    """`--sim-model-size NAME=SIZE` (repeatable): a model file's weights on the simulated
    GPU, by its path as given or its file name (model.with_weights)."""

    visible: CudaDevices | None = None
    """The GPUs CUDA shows this process (set from the simulated host and
    CUDA_VISIBLE_DEVICES once it is known); None: CUDA device n is host GPU n."""

    @property
    def named_device(self) -> str | None:
        """The device `-dev` names (its first), unless `none`; None without `-dev`."""
        if self.device is None:
            return None
        first = self.device.split(",")[0].strip()
        return None if first == "none" else first

    @property
    def ordinal(self) -> int | None:
        """The CUDA device the model goes to; None for `-dev none`.

        `-dev CUDA<n>` names it; without `-dev` it is the first one (or `--sim-gpu`)."""
        if self.device is None:
            return self.sim_gpu or 0
        first = self.named_device
        if first is None:
            return None
        digits = "".join(ch for ch in first if ch.isdigit())
        return int(digits) if digits else 0

    @property
    def gpu(self) -> int | None:
        """The host GPU the model goes to; None when it stays in system memory (`-dev
        none`, or CUDA shows the process no such device)."""
        ordinal = self.ordinal
        if ordinal is None or self.visible is None:
            return ordinal
        return self.visible.host_gpu(ordinal)


def _set(args: Args, name: str, value: str) -> None:
    if name in ("port", "ctx_size", "parallel", "n_predict", "ubatch", "batch", "fit_ctx",
                "models_max"):  # fmt: skip
        try:
            setattr(args, name, int(value))
        except ValueError:
            raise ValueError(f"invalid argument: {value}") from None
        if name == "parallel" and int(value) == 0:
            raise ValueError("invalid value for n_parallel")
    elif name == "n_gpu_layers":
        args.n_gpu_layers = {"auto": NGL_AUTO, "all": NGL_ALL}.get(value) or int(value)
    elif name == "alias":
        args.alias = tuple(a.strip() for a in value.split(",") if a.strip())
    elif name == "fit":
        if value not in ("on", "off", "true", "false", "1", "0", "enabled", "disabled"):
            raise ValueError(f"unknown value for --fit: '{value}'")
        args.fit = value in ("on", "true", "1", "enabled")
    elif name == "fit_target":
        args.fit_target = int(value.split(",")[0]) * 1024 * 1024
    elif name == "flash_attn":
        if value not in ("on", "off", "auto"):
            raise ValueError(f"unknown value for --flash-attn: '{value}'")
        args.flash_attn = value
    elif name == "pooling":
        if value not in ("none", "mean", "cls", "last", "rank"):
            raise ValueError("invalid value")
        args.pooling = value
    else:
        setattr(args, name, value)


def parse_args(words: Sequence[str]) -> Args:
    """The command line `words`; ValueError with the real program's complaint."""
    args = Args()
    for env, name in _ENV.items():
        if os.environ.get(env):
            _set(args, name, os.environ[env])
    i = 0
    while i < len(words):
        word = words[i]
        key, eq, inline = word.partition("=")
        if word.startswith("--sim-"):
            value = inline if eq else (words[i + 1] if i + 1 < len(words) else "")
            i += 1 if eq else 2
            _sim(args, key, value)
            continue
        if word in _FLAGS:
            setattr(args, *_FLAGS[word])
        elif word in _VALUED or word in _IGNORED_VALUED:
            if i + 1 >= len(words):
                raise ValueError(f"expected value for argument {word}")
            if word in _VALUED:
                _set(args, _VALUED[word], words[i + 1])
            i += 1
        elif word not in _IGNORED_FLAGS:
            raise ValueError(f"invalid argument: {word}")
        i += 1
    return args


def _sim(args: Args, key: str, value: str) -> None:
    if key == "--sim-state-dir":
        args.sim_state_dir = Path(value)
    elif key == "--sim-gpu":
        args.sim_gpu = int(value)
    elif key == "--sim-load-seconds":
        args.sim_load_seconds = parse_duration(value)
    elif key == "--sim-tokens-per-second":
        args.sim_tokens_per_second = float(value)
    elif key == "--sim-prompt-tokens-per-second":
        args.sim_prompt_tokens_per_second = float(value)
    elif key == "--sim-eos-after":
        args.sim_eos_after = int(value)
    elif key == "--sim-record":
        args.sim_record = Path(value)
    elif key == "--sim-model-size":
        name, sep, size = value.rpartition("=")
        if not sep or not name:
            raise ValueError(f"--sim-model-size: expected NAME=SIZE, got {value!r}")
        try:
            args.sim_model_sizes[name] = parse_size(size)
        except ValueError as exc:
            raise ValueError(f"--sim-model-size: {exc}") from None
    else:
        raise ValueError(f"invalid argument: {key}")
