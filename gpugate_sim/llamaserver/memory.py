"""What a loaded model holds on the simulated GPU, and taking and giving it back.

    held = weights on the GPU + KV cache + compute buffer

* weights: the tensors of the last `n_gpu_layers` repeating layers (`blk.N.*`), plus the
  output layer when `n_gpu_layers` > n_layer; the token embeddings stay in host memory
  (src/llama-model.cpp `load_tensors`: `i_gpu_start = n_layer - n_gpu_layers`, the input
  layer always on the CPU, the output layer on the GPU only for n_layer + 1);
* KV cache: n_ctx × Σ over offloaded layers of (n_embd_k_gqa + n_embd_v_gqa) × 2 bytes
  (f16 K and V, src/llama-kv-cache.cpp; one unified stream: the server's auto n_parallel
  sets kv_unified, tools/server/server.cpp);
* compute buffer: n_ubatch × (n_vocab + 4 × n_embd) × 4 bytes, an estimate of the graph's
  f32 scratch (logits and activations of one micro-batch) when any layer is offloaded.

`fit` follows common/fit.cpp's order: when the full plan does not leave `fit_target` free,
a context the user did not set is first cut (linearly, down to `fit_min_ctx`, rounded down
to 256), then, if `-ngl` was left on auto, layers are moved off the GPU.
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
NGL_AUTO = -1
NGL_ALL = -2


@attrs.frozen
class MemoryPlan:
    """How a model is placed: context, layers on the GPU, and the bytes of each part."""

    n_ctx: int
    gpu_layers: int
    weights: int
    kv: int
    compute: int

    @property
    def total(self) -> int:
        return self.weights + self.kv + self.compute


def plan(model: ModelInfo, n_ctx: int, gpu_layers: int, n_ubatch: int = N_UBATCH) -> MemoryPlan:
    """The bytes `model` takes on the GPU with this context and these layers offloaded."""
    gpu_layers = max(0, min(gpu_layers, model.n_layer + 1))
    repeating = min(gpu_layers, model.n_layer)
    weights = layer_sum(model.layer_bytes, repeating)
    if gpu_layers > model.n_layer:
        weights += model.output_bytes
    kv = n_ctx * model.kv_bytes_per_token(repeating)
    compute = n_ubatch * (model.n_vocab + 4 * model.n_embd) * 4 if gpu_layers else 0
    return MemoryPlan(n_ctx, gpu_layers, weights, kv, compute)


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


def place(model: ModelInfo, options: PlacementOptions, free: int | None) -> MemoryPlan:
    """The plan llama-server starts `model` with, given the GPU's `free` bytes."""
    ctx_auto = not options.ctx_size
    n_ctx = options.ctx_size or model.n_ctx_train
    if not options.on_gpu:
        return plan(model, n_ctx, 0, options.n_ubatch)
    ngl = options.n_gpu_layers
    layers = model.n_layer + 1 if ngl < 0 else ngl
    full = plan(model, n_ctx, layers, options.n_ubatch)
    if not options.fit or free is None or full.total <= free - options.fit_target:
        return full
    target = free - options.fit_target
    # -c 0 asks for the full context: fit.cpp's minimum becomes UINT32_MAX, no cut.
    min_ctx = options.fit_min_ctx if options.ctx_size is None else n_ctx
    if ctx_auto and n_ctx > min_ctx:
        smallest = plan(model, min_ctx, layers, options.n_ubatch)
        if target > smallest.total:
            grown = min_ctx + (n_ctx - min_ctx) * (target - smallest.total) // (
                full.total - smallest.total
            )
            cut = max(grown - grown % CTX_ALIGN, min_ctx)
            return plan(model, cut, layers, options.n_ubatch)
        n_ctx = min_ctx
    if ngl != NGL_AUTO:
        return plan(model, n_ctx, layers, options.n_ubatch)
    for fewer in range(layers, -1, -1):
        candidate = plan(model, n_ctx, fewer, options.n_ubatch)
        if candidate.total <= target:
            return candidate
    return plan(model, n_ctx, 0, options.n_ubatch)


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
