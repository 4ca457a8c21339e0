"""Request options: the runner options that decide a load, and the per-request ones.

Ollama reads `options` with `Options.FromMap`: unknown keys are ignored (which is why the
simulation's own `sim_*` keys pass through any proxy untouched), known keys must have the
right JSON type. The runner options (num_ctx, num_batch, num_gpu, main_gpu, use_mmap,
num_thread) are fixed when a model loads; a request that asks for different ones makes
the scheduler reload the model (`needsReload`).
"""

from __future__ import annotations

import attrs

from gpugate_sim.ollama.catalog import CatalogModel
from gpugate_sim.ollama.gofold import go_int64
from gpugate_sim.ollama.sizing import runner_bytes

MIN_NUM_CTX = 4
DEFAULT_NUM_BATCH = 512


class OptionError(ValueError):
    """An option of the wrong JSON type; the message is Ollama's."""


@attrs.frozen
class RunnerOptions:
    """What a runner was (or would be) started with."""

    num_ctx: int
    num_batch: int = DEFAULT_NUM_BATCH
    num_gpu: int = -1
    """-1: as many layers as fit; 0: CPU only; N: N layers on the GPU."""
    main_gpu: int | None = None
    """None: not given; on several GPUs a given one picks the GPU (placement.select)."""
    use_mmap: bool | None = None
    num_thread: int = 0

    def needs_reload(self, requested: RunnerOptions) -> bool:
        """True when a runner started with these options cannot serve `requested`."""
        current = self
        if requested.num_gpu < 0:
            # Ollama ignores num_gpu when the new request leaves it automatic.
            current = attrs.evolve(current, num_gpu=-1)
        # v0.24.0's MainGPU is an int: an absent main_gpu and 0 are the same option.
        current = attrs.evolve(current, main_gpu=current.main_gpu or 0)
        return current != attrs.evolve(requested, main_gpu=requested.main_gpu or 0)

    def as_json(self) -> dict[str, object]:
        return attrs.asdict(self)


@attrs.frozen
class RequestOptions:
    """Everything a request's `options` decides in the simulation."""

    runner: RunnerOptions
    num_predict: int = -1
    fail_after_tokens: int | None = None
    """sim_fail_after_tokens: end the generation with an error after this many tokens."""
    load_fail: bool = False
    """sim_load_fail: the runner fails to load the model."""
    tokens: int | None = None
    """sim_tokens: the answer is this many tokens long (before num_predict cuts it)."""
    num_ctx_auto: bool = False
    """The context is Ollama's automatic one: the request sets none and the model's is
    (server/routes.go `usesAutomaticNumCtx`)."""


def _integer(options: dict[str, object], key: str) -> int | None:
    value = options.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise OptionError(f'option "{key}" must be of type integer')
    # A JSON number is a float64 in Go's map; FromMap sets the field to int64(it).
    return go_int64(value)


def _boolean(options: dict[str, object], key: str) -> bool | None:
    value = options.get(key)
    if value is None:
        return None
    if not isinstance(value, bool):
        raise OptionError(f'option "{key}" must be of type boolean')
    return value


_KINDS = {
    **dict.fromkeys(
        ("num_ctx", "num_batch", "num_gpu", "main_gpu", "num_thread", "num_keep", "seed"),
        "integer",
    ),
    **dict.fromkeys(("num_predict", "top_k", "repeat_last_n"), "integer"),
    **dict.fromkeys(
        ("top_p", "min_p", "typical_p", "temperature", "repeat_penalty", "presence_penalty"),
        "float32",
    ),
    "frequency_penalty": "float32",
    "use_mmap": "boolean",
    "stop": "array",
}
"""api/types.go Options (and its Runner): each option's kind, as FromMap names it."""


def check_options(options: dict[str, object]) -> None:
    """Options.FromMap's type checks (a JSON number is a float64; null is skipped), for
    every option it knows; OptionError with its words for the first one that fails."""
    for key, value in options.items():
        kind = _KINDS.get(key)
        if kind is None or value is None:
            continue
        number = isinstance(value, int | float) and not isinstance(value, bool)
        if kind in ("integer", "float32") and not number:
            raise OptionError(f'option "{key}" must be of type {kind}')
        if kind == "boolean" and not isinstance(value, bool):
            raise OptionError(f'option "{key}" must be of type boolean')
        if kind == "array":
            if not isinstance(value, list):
                raise OptionError(f'option "{key}" must be of type array')
            if not all(isinstance(item, str) for item in value):
                raise OptionError(f'option "{key}" must be of an array of strings')


def parse_options(
    model: CatalogModel, options: dict[str, object] | None, *, runner_options: bool = True
) -> RequestOptions:
    """Read a request's `options` for `model`; OptionError as Options.FromMap refuses them.

    With `runner_options=False` (the /v1 routes, which cannot set them) the runner
    options are the model's defaults whatever the body says.
    """
    options = options or {}
    if runner_options:
        check_options(options)
    num_ctx = _integer(options, "num_ctx") if runner_options else None
    num_batch = _integer(options, "num_batch") if runner_options else None
    num_gpu = _integer(options, "num_gpu") if runner_options else None
    main_gpu = _integer(options, "main_gpu") if runner_options else None
    num_thread = _integer(options, "num_thread") if runner_options else None
    use_mmap = _boolean(options, "use_mmap") if runner_options else None
    runner = RunnerOptions(
        num_ctx=max(MIN_NUM_CTX, num_ctx if num_ctx is not None else model.default_num_ctx),
        num_batch=num_batch if num_batch is not None else DEFAULT_NUM_BATCH,
        num_gpu=num_gpu if num_gpu is not None else -1,
        main_gpu=main_gpu,
        use_mmap=use_mmap,
        num_thread=num_thread if num_thread is not None else 0,
    )
    num_predict = _integer(options, "num_predict")
    fail_after = _integer(options, "sim_fail_after_tokens")
    tokens = _integer(options, "sim_tokens")
    return RequestOptions(
        runner=runner,
        num_predict=-1 if num_predict is None else num_predict,
        fail_after_tokens=None if fail_after is None else max(0, fail_after),
        load_fail=bool(_boolean(options, "sim_load_fail")),
        tokens=None if tokens is None else max(1, tokens),
        num_ctx_auto=num_ctx is None and model.auto_num_ctx,
    )


RUNNER_INTS = ("num_ctx", "num_batch", "num_gpu", "main_gpu", "num_thread")


def runner_set(options: dict[str, object] | None) -> dict[str, int | bool]:
    """The runner options (api.Runner's) a request's `options` set, as FromMap sets them
    (a number through int64(), null skipped): what the scheduler compares to reload."""
    options = options or {}
    found: dict[str, int | bool] = {}
    for key in RUNNER_INTS:
        value = options.get(key)
        if isinstance(value, int | float) and not isinstance(value, bool):
            found[key] = go_int64(value)
    if isinstance(options.get("use_mmap"), bool):
        found["use_mmap"] = bool(options["use_mmap"])
    return found


def effective_num_ctx(model: CatalogModel, runner: RunnerOptions) -> int:
    """The context a runner actually gets: num_ctx capped at the training context."""
    return max(MIN_NUM_CTX, min(runner.num_ctx, model.spec.context_length))


def runner_size(model: CatalogModel, runner: RunnerOptions, parallel: int = 1) -> int:
    """Total bytes (GPU + CPU) a runner holds with these options: what llama-server holds
    for the model's blob (sizing.py), or, for a model whose size its spec gives, that size
    and `kv_bytes_per_token` for every token of context beyond the default."""
    if not model.spec.size and model.blob_size:
        return runner_bytes(
            model.blob_path, effective_num_ctx(model, runner), parallel, runner.num_batch,
            model.spec.embedding,
        )  # fmt: skip
    delta = effective_num_ctx(model, runner) - model.default_num_ctx
    return max(1, model.spec.size + delta * model.spec.kv_bytes_per_token)


def requested_gpu_share(model: CatalogModel, runner: RunnerOptions, size: int) -> int | None:
    """Bytes on the GPU when num_gpu asks for it explicitly; None when it is automatic."""
    if runner.num_gpu < 0:
        return None
    layers = min(runner.num_gpu, model.spec.block_count)
    return size * layers // model.spec.block_count
