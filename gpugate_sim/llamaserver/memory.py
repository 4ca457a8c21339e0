"""What a loaded model holds on the simulated GPU, and taking and giving it back.

    held = CUDA context + weights on the GPU + KV cache + compute buffer

as llama-server (llama.cpp in llama-cpp-python 0.3.36) allocates them:

* CUDA context: CUDA_CONTEXT, taken when the process starts on a GPU (ggml's CUDA backend
  initialises before the model loads) and kept until it exits; no buffer counts it.
* weights: of the n_layer + 1 layers (the repeating `blk.N` ones, then the output layer)
  the last `n_gpu_layers` are on the GPU (src/llama-model.cpp `load_tensors`:
  `i_gpu_start = n_layer + 1 - n_gpu_layers`), so the output layer is there as soon as any
  layer is; the token embeddings stay in host memory ("very little benefit to offloading
  the input layer"), and a file without an output matrix gets them again as its output
  layer (model.py).
* KV cache: for each offloaded repeating layer, (n_embd_k_gqa + n_embd_v_gqa) × 2 bytes
  (f16) for each cell (src/llama-kv-cache.cpp). The cells: the context padded to 256 for
  each stream, one stream when the server chose its slots itself (`kv_unified`), else one
  per slot sharing the context; sliding-window layers only min(cells, window + n_ubatch)
  padded (src/llama-kv-cache-iswa.cpp `size_swa`).
* compute buffer: the largest set of intermediate tensors live at once in one micro-batch
  of n_ubatch tokens, as ggml-alloc packs the llama graph (reserved for one output token
  a slot): with flash attention the f16 attention mask (cells × n_ubatch) plus the
  largest of the feed-forward phase (3 × n_ff + 4 × n_embd floats a token, 2 × n_ff where
  n_ff ≤ 2 × n_embd) and the attention phase (5 × n_embd, or 4 × n_embd + 2 × n_embd_kv);
  without it an f32 mask and every head's attention matrix (cells × n_ubatch × n_head
  floats) beside 6 × n_embd. These are the figures the real server logged for it
  (`CPU compute buffer size`) across the tiny models' widths, contexts and micro-batches.

`fit` follows common/fit.cpp's order: a context the user did not set is first the training
context for each KV stream (one per slot with `-np N`, one when the server chose its
slots); when the full plan does not leave `fit_target` free, that context is cut (linearly,
down to `fit_min_ctx` a stream, rounded down to 256 a stream), then, if `-ngl` was left on
auto, layers are moved off the GPU.
"""

from __future__ import annotations

import os
import sys
from typing import TextIO

import attrs

from gpugate.core.units import GiB, MiB
from gpugate_sim.device import GpuOutOfMemory, SimulatedGpuHost
from gpugate_sim.llamaserver.model import ModelInfo, layer_sum

PROCESS_NAME = "llama-server"
N_UBATCH = 512
FIT_TARGET = 1 * GiB
FIT_MIN_CTX = 4096
CTX_ALIGN = 256
KV_PAD = 256
NGL_AUTO = -1
NGL_ALL = -2
CUDA_CONTEXT = 512 * MiB
"""What a ggml CUDA process holds beyond its buffers (context, cuBLAS workspace, pools): an
Ollama llama3.2:3b runner showed 3.1 GiB in NVML on a 16 GiB card for 2.57 GiB of
weights, KV cache and graph."""


@attrs.frozen
class MemoryPlan:
    """How a model is placed: context, layers on the GPU, and the bytes of each part."""

    n_ctx: int
    gpu_layers: int
    weights: int
    kv: int
    compute: int
    streams: int = 1
    """KV streams: one per slot the user set (`-np N`), one shared when the server chose."""

    @property
    def slot_ctx(self) -> int:
        """A slot's context: the context shared by the streams (what /props and /v1/models
        report, and what a prompt must fit in)."""
        return self.n_ctx // self.streams

    @property
    def total(self) -> int:
        """The buffers on the GPU (the process's CUDA context comes on top)."""
        return self.weights + self.kv + self.compute


def _pad(n: int) -> int:
    return -(-n // KV_PAD) * KV_PAD


def plan(
    model: ModelInfo,
    n_ctx: int,
    gpu_layers: int,
    n_ubatch: int = N_UBATCH,
    *,
    streams: int = 1,
    slots: int = 1,
    flash_attn: bool = True,
) -> MemoryPlan:
    """The bytes `model` takes on the GPU with this context and these layers offloaded;
    `streams` KV streams (1 unified, else one per slot) for `slots` slots."""
    gpu_layers = max(0, min(gpu_layers, model.n_layer + 1))
    streams = max(1, streams)
    if gpu_layers == 0:
        return MemoryPlan(n_ctx, 0, 0, 0, 0, streams)
    first = model.n_layer + 1 - gpu_layers
    weights = layer_sum(model.layer_bytes, model.n_layer - first) + model.output_bytes
    cells = _pad(max(1, n_ctx // streams))
    window = 0
    if model.n_swa:
        window = min(cells, _pad(model.n_swa * (slots if streams == 1 else 1) + n_ubatch))
    per_cell = [h * (model.n_embd_head_k + model.n_embd_head_v) * 2 for h in model.n_head_kv]
    kv = streams * sum(
        (window if model.is_swa(layer) else cells) * per_cell[layer]
        for layer in range(max(first, 0), model.n_layer)
    )
    e, ff = model.n_embd, model.n_ff
    kv_e = max(model.n_head_kv, default=0) * max(model.n_embd_head_k, model.n_embd_head_v)
    ffn = (3 * ff if ff > 2 * e else 2 * ff) + 4 * e
    phase = 4 * n_ubatch * max(ffn, 5 * e, 4 * e + 2 * kv_e)
    masked = (cells + window) * n_ubatch
    if flash_attn:
        compute = phase + 2 * masked
    else:
        scores = 4 * cells * n_ubatch * model.n_head + 4 * n_ubatch * 6 * e
        compute = 4 * masked + max(phase, scores)
    return MemoryPlan(n_ctx, gpu_layers, weights, kv, compute, streams)


@attrs.frozen
class PlacementOptions:
    """The command-line options that decide a placement."""

    ctx_size: int | None = None
    """`-c`: None when not given (then 0: the model's training context)."""
    n_gpu_layers: int = NGL_AUTO
    fit: bool = True
    fit_target: int = FIT_TARGET
    fit_min_ctx: int = FIT_MIN_CTX
    n_ubatch: int = N_UBATCH
    on_gpu: bool = True
    """False for `-dev none`: nothing is offloaded."""
    streams: int = 1
    slots: int = 1
    flash_attn: bool = True


def place(model: ModelInfo, options: PlacementOptions, free: int | None) -> MemoryPlan:
    """The plan llama-server starts `model` with, given the GPU's `free` bytes."""
    ctx_auto = not options.ctx_size
    streams = max(1, options.streams)
    n_ctx = options.ctx_size or model.n_ctx_train
    if ctx_auto and options.fit:
        # fit.cpp `common_params_fit_impl`: an unset context becomes the training context
        # for every KV stream (`n_ctx_max = hp_nct × n_streams`) before anything is measured.
        n_ctx = model.n_ctx_train * streams

    def sized(n_ctx: int, layers: int) -> MemoryPlan:
        return plan(
            model, n_ctx, layers, options.n_ubatch, streams=options.streams,
            slots=options.slots, flash_attn=options.flash_attn,
        )  # fmt: skip

    if not options.on_gpu:
        return sized(n_ctx, 0)
    ngl = options.n_gpu_layers
    layers = model.n_layer + 1 if ngl < 0 else ngl
    full = sized(n_ctx, layers)
    if not options.fit or free is None or full.total <= free - options.fit_target:
        return full
    target = free - options.fit_target
    # -c 0 asks for the full context: fit.cpp's minimum becomes UINT32_MAX, no cut. The
    # minimum and the rounding are per KV stream (`n_ctx_min_total`, `256 * n_streams`).
    min_ctx = options.fit_min_ctx * streams if options.ctx_size is None else n_ctx
    if ctx_auto and n_ctx > min_ctx:
        smallest = sized(min_ctx, layers)
        if target > smallest.total:
            grown = min_ctx + (n_ctx - min_ctx) * (target - smallest.total) // (
                full.total - smallest.total
            )
            cut = max(grown - grown % (CTX_ALIGN * streams), min_ctx)
            return sized(cut, layers)
        n_ctx = min_ctx
    if ngl != NGL_AUTO:
        return sized(n_ctx, layers)
    for fewer in range(layers, -1, -1):
        candidate = sized(n_ctx, fewer)
        if candidate.total <= target:
            return candidate
    return sized(n_ctx, 0)


class LoadFailed(Exception):
    """A part of the model could not be allocated; the lines llama.cpp prints."""

    def __init__(self, lines: list[str]) -> None:
        super().__init__("\n".join(lines))
        self.lines = lines


class GpuHolding:
    """A process's part of the simulated GPU: taken in two steps, given back at once."""

    def __init__(
        self,
        gpu_host: SimulatedGpuHost | None,
        gpu: int,
        *,
        ordinal: int | None = None,
        err: TextIO = sys.stderr,
    ) -> None:
        self.gpu_host = gpu_host
        self.gpu = gpu
        """The host GPU."""
        self.ordinal = gpu if ordinal is None else ordinal
        """The CUDA device it is to the process, as llama.cpp's messages name it."""
        self.err = err
        self.pid = os.getpid()
        self.held = 0

    def free_bytes(self) -> int | None:
        """What the device has free now (what llama_params_fit asks the backend)."""
        if self.gpu_host is None:
            return None
        return self.gpu_host.free(self.gpu)

    def take(self, nbytes: int, what: str) -> None:
        """Allocate `nbytes` for `what` (a buffer's name); LoadFailed when it does not fit."""
        if self.gpu_host is None or nbytes <= 0:
            return
        try:
            self.gpu_host.allocate(self.pid, nbytes, gpu=self.gpu, name=PROCESS_NAME)
        except GpuOutOfMemory:
            raise LoadFailed([
                f"ggml_backend_cuda_buffer_type_alloc_buffer: allocating {nbytes / MiB:.2f} MiB "
                f"on device {self.ordinal}: cudaMalloc failed: out of memory",
                f"alloc_tensor_range: failed to allocate CUDA{self.ordinal} buffer of size "
                f"{nbytes}",
                f"llama_model_load: error loading model: unable to allocate {what}",
            ]) from None  # fmt: skip
        self.held += nbytes

    def release(self) -> None:
        """Give everything back (llama_free / process exit)."""
        if self.gpu_host is not None and self.held:
            self.gpu_host.release(self.pid, gpu=self.gpu)
        self.held = 0
