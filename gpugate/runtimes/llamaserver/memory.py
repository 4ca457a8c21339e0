"""How llama-server takes memory for a model, read from its GGUF file and its arguments.

Each model runs in a llama-server process of its own (one with `-m FILE`, or a router's
child, which takes the router's arguments and its preset's: server-models.cpp), and what
that process holds follows from the file and its command line (gpugate.runtimes.llamacpp):
`-c`/`--ctx-size` (unset or 0: the trained context), `-np`/`--parallel` (unset: 4 slots
sharing one KV stream, `kv_unified`; set: a stream each), `-ub`/`--ubatch-size` (512, at
most `-b`), `-ngl` (unset: all that fit), `-fa`/`--flash-attn` (auto: on),
`-ctk`/`-ctv` (the KV cache's types), `-dev none` (nothing on a GPU).

It is FITTED: `--fit` (on unless `--fit off`, common/arg.cpp) cuts a context the command
did not set to what the card has free less `--fit-target`, down to `--fit-ctx`, before it
moves layers to the CPU (common/fit.cpp). So a load of a model whose context is unset
takes anywhere from its floor (that smallest context) to its ceiling (the trained one).
Its knob is the context (`-c N`: a load that fits in what the gate gives it), and
`--fit-target` for what `--fit` must leave free.

The gate reads the file from the path the arguments name: it runs on the same host. A
file it cannot read leaves the model unsized (a configured `envelope` then sizes it).
"""

from __future__ import annotations

from collections.abc import Callable

import attrs

from gpugate.runtimes.footprint import Cap, Cards, Elasticity, Footprint, Knob
from gpugate.runtimes.gguf import cached_header
from gpugate.runtimes.llamacpp import (
    FIT_MIN_CTX,
    N_UBATCH,
    LoadOptions,
    ModelShape,
    fit_context,
    fitted,
    header_shape,
)
from gpugate.runtimes.parts import Configured, Memory

Option = Callable[..., str | None]
"""The value of the last of some option names on a command line (None: not given)."""
AUTO_PARALLEL = 4
"""The slots llama-server gives itself when `-np` is not set (tools/server: "n_parallel
is set to auto, using n_parallel = 4 and kv_unified = true")."""
KV_TYPE_BYTES = {"f32": 4.0, "f16": 2.0, "bf16": 2.0, "q8_0": 34 / 32, "q5_0": 22 / 32,
                 "q5_1": 24 / 32, "q4_0": 18 / 32, "q4_1": 20 / 32, "iq4_nl": 18 / 32}  # fmt: skip
"""Bytes per K/V value of `--cache-type-k/-v` (ggml's block sizes)."""
CONTEXT_KNOB = Knob(("-c", "--ctx-size"), env="LLAMA_ARG_CTX_SIZE")
"""`-c`: a context set here is never cut by `--fit` (common/arg.cpp, `-c`'s handler and
`common_params_fit`); the command line wins over the variable, with a warning
(`common_params_parse_ex`: "environment variable is set, but will be overwritten")."""


def _int(text: str | None) -> int | None:
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


@attrs.frozen
class Launch:
    """A llama-server command line as its memory reads it."""

    options: LoadOptions
    ctx_set: bool
    """`-c` was given: `--fit` does not cut it."""
    fit: bool

    @classmethod
    def read(cls, option: Option) -> Launch:
        ctx = option("-c", "--ctx-size")
        parallel = _int(option("-np", "--parallel"))
        auto = parallel is None or parallel < 0
        unified = auto or option("-kvu", "--kv-unified") is not None
        batch = _int(option("-b", "--batch-size"))
        ubatch = _int(option("-ub", "--ubatch-size")) or N_UBATCH
        ngl = option("-ngl", "--n-gpu-layers", "--gpu-layers")
        layers = None if ngl in (None, "auto", "all") else _int(ngl)
        cache_k = option("-ctk", "--cache-type-k") or "f16"
        cache_v = option("-ctv", "--cache-type-v") or "f16"
        kv = (KV_TYPE_BYTES.get(cache_k, 2.0) + KV_TYPE_BYTES.get(cache_v, 2.0)) / 2
        device = option("-dev", "--device")
        return cls(
            LoadOptions(
                n_ctx=_int(ctx) or 0,
                n_parallel=AUTO_PARALLEL if auto else max(1, parallel or 1),
                unified=unified,
                n_ubatch=min(ubatch, batch) if batch else ubatch,
                n_gpu_layers=layers,
                flash_attn=option("-fa", "--flash-attn") not in ("off", "0", "false"),
                kv_bytes=kv,
                on_gpu=device != "none" and layers != 0,
            ),
            ctx_set=ctx is not None,
            fit=option("-fit", "--fit") not in ("off", "0", "false"),
        )


def footprint(path: str | None, option: Option) -> Footprint | None:
    """What a llama-server of the model at `path`, started with the options `option`
    reads, holds: floor and ceiling under `--fit`. None when the file cannot be read."""
    shape = _shape(path)
    if shape is None:
        return None
    launch = Launch.read(option)
    floor, ceiling = fitted(shape, launch.options, ctx_set=launch.ctx_set or not launch.fit)
    return Footprint(ceiling.total, floor.total)


def _shape(path: str | None) -> ModelShape | None:
    header = cached_header(path) if path else None
    return header_shape(header) if header is not None else None


def context_cap(path: str | None, option: Option, nbytes: int) -> Cap | None:
    """`-c N`, the largest context whose load fits in `nbytes`, no less than `--fit` would
    cut to and no more than the model's trained context (what an unset `-c` gives); None
    when the file cannot be read."""
    shape = _shape(path)
    if shape is None:
        return None
    launch = Launch.read(option)
    context = max(fit_context(shape, launch.options, nbytes), FIT_MIN_CTX)
    if shape.n_ctx_train > 0:
        context = min(context, shape.n_ctx_train)
    return Cap(args=("-c", str(context)), knob=CONTEXT_KNOB)


class SingleMemory(Memory):
    """A single-model llama-server: its process's load, from the file and options its
    command names."""

    elasticity = Elasticity.FITTED
    knob = "-c, --fit-target"

    def __init__(self, settings: Configured, option: Option) -> None:
        """`option`: an option's value on the process's command line."""
        super().__init__(settings)
        self.option = option

    def read(self, model: str, cards: Cards) -> Footprint | None:
        """`model` is the file the command's `-m` names."""
        return footprint(model, self.option)

    def cap(self, model: str, nbytes: int, cards: Cards) -> Cap | None:
        return context_cap(model, self.option, nbytes)
