"""What llama.cpp's llama-server holds on a card for a model: the sizes of a first load,
before the gate ever measured one.

Two runtimes load GGUF models with llama-server: llama-server itself, and Ollama, which
since v0.30 starts one llama-server per loaded model (llm/llama_server.go
`startLlamaServer`: `-c num_ctx×parallel -np parallel`, `-b`/`-ub` its batch, no `-ngl`,
so llama-server's own `--fit` places the layers). What such a process holds on the GPU
is the sum of the buffers llama-server logs at load (Ollama parses the same lines,
`memoryParsingWriter`), plus the CUDA context no buffer counts:

* **weights** (`CUDA0 model buffer`): every tensor but the token embeddings, which stay in
  host memory (src/llama-model.cpp `load_tensors`: "there is very little benefit to
  offloading the input layer, so always keep it on the CPU"); a model without its own
  `output.weight` gets the token embeddings again as its output layer, on the GPU
  (src/models/llama.cpp: `TENSOR_DUPLICATED`). With `-ngl N` below n_layer + 1 only the
  last N of the n_layer + 1 layers are offloaded, the output layer first
  (`i_gpu_start = n_layer + 1 - n_gpu_layers`).
* **KV cache** (`CUDA0 KV buffer`): for every layer, K and V for every cell,
  (n_embd_k_gqa + n_embd_v_gqa) × 2 bytes in f16 (src/llama-kv-cache.cpp). The cells are
  the context padded to 256, per stream: one stream of `-c` cells when the server picks
  its parallel slots itself (`kv_unified`), else `-np` streams of `-c / -np` cells each.
  Sliding-window layers (gemma2, gemma3: `load_swa_pattern`) hold only
  min(cells, n_swa + n_ubatch) padded to 256 (src/llama-kv-cache-iswa.cpp `size_swa`).
* **compute buffer** (`CUDA0 compute buffer`): the graph's largest set of live
  intermediate tensors for one micro-batch of n_ubatch tokens (ggml-alloc reuses a
  tensor's memory once its last consumer ran; the server reserves logits for one token
  per slot, `n_outputs_max`). With flash attention (llama-server's `auto`, on wherever the
  backend has it) that is the attention mask, n_kv × n_ubatch in f16, plus the largest of
  the feed-forward phase (3 × n_ff + 4 × n_embd floats a token; 2 × n_ff where n_ff ≤
  2 × n_embd, as ggml-alloc packs them), the attention phase (5 × n_embd, or 4 × n_embd +
  2 × n_embd_kv), measured on llama-server's CPU build for the llama graph across
  n_embd 64-512, n_ff 32-4096, contexts 512-4096 and micro-batches 64-2048
  (tests/runtimes/test_llamacpp_memory.py holds the points). Without flash attention the
  mask is f32, and the attention phase holds every head's full attention matrix,
  n_kv × n_ubatch × n_head floats.
  Ollama's own figure for the graph (fs/ggml `GraphSize`) sized its former engine's
  graph, which kept the logits of the whole batch; llama-server's is smaller.
* **CUDA context**: CUDA_CONTEXT, what NVML shows a ggml CUDA process holding beyond
  its buffers.

`--fit` (common/fit.cpp, on by default) changes this only when the device's free memory
less `--fit-target` (1 GiB) cannot hold it: a context the command did not set is cut
first, down to `--fit-ctx` (4096), then layers move to the CPU. So a load is anywhere
between a floor (the smallest context, every layer) and its ceiling (the full plan).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import attrs

from gpugate.core.units import GiB, MiB
from gpugate.runtimes.gguf import GgufHeader, LongArray, MetaValue, TensorInfo

CUDA_CONTEXT = 512 * MiB
"""What a ggml CUDA process holds beyond its buffers (the CUDA context, cuBLAS's workspace,
ggml's pools): Ollama's llama3.2:3b runner showed 3.1 GiB in NVML on a 16 GiB card for
2.57 GiB of weights, KV cache and graph."""
KV_PAD = 256
"""Cells of a KV stream are a multiple of this (src/llama-kv-cache.cpp, `n_pad`)."""
N_UBATCH = 512
"""llama-server's default micro-batch (`-ub`)."""
FIT_TARGET = 1 * GiB
"""`--fit-target`'s default: the free memory `--fit` leaves on each device."""
FIT_MIN_CTX = 4096
"""`--fit-ctx`'s default: the smallest context `--fit` cuts an unset context to."""
SWA_PATTERNS = {"gemma2": 2, "gemma3": 6}
"""How many layers make one sliding-window period, the last of them global
(src/models/gemma2.cpp, gemma3.cpp `load_swa_pattern`; `<arch>.attention.
sliding_window_pattern` overrides it)."""
INPUT_LAYER = ("token_embd.", "position_embd.", "token_types.")
"""The input layer's tensors, kept in host memory (src/llama-arch.cpp: the tensors of
`LLM_TENSOR_LAYER_INPUT`)."""
GEMMA2_WINDOW = 4096
"""gemma2's window when its file names none (src/models/gemma2.cpp)."""


@attrs.frozen
class ModelShape:
    """What a model file says that its memory follows from."""

    arch: str
    n_layer: int
    n_embd: int
    n_ff: int
    n_head: int
    n_head_kv: tuple[int, ...]
    """Per layer."""
    head_k: int
    head_v: int
    n_ctx_train: int
    n_vocab: int
    n_swa: int
    """The sliding window of the layers that have one (0: none has)."""
    swa_pattern: int
    layer_bytes: tuple[int, ...]
    input_bytes: int
    """The input layer (token, position and type embeddings): kept in host memory."""
    output_bytes: int
    """The output layer (its norm and matrix): on the GPU with every layer offloaded."""
    token_embd: int = 0
    """The token embeddings alone (what a tied output layer copies)."""
    tied: bool = False
    """The file has no output matrix: the token embeddings serve as one, copied to the
    output layer's device."""
    embedding: bool = False
    """An embedding model (`<arch>.pooling_type`)."""

    @property
    def weights(self) -> int:
        """Bytes of every tensor the file holds."""
        return sum(self.layer_bytes) + self.input_bytes + self.output_bytes

    @property
    def output_layer(self) -> int:
        """What the output layer holds where it is loaded (the tied embeddings' copy too)."""
        return self.output_bytes + (self.token_embd if self.tied else 0)

    def is_swa(self, layer: int) -> bool:
        """Whether `layer` attends over the sliding window only (llama_hparams
        `set_swa_pattern`, dense last)."""
        pattern = self.swa_pattern
        return self.n_swa > 0 and pattern > 0 and layer % pattern < pattern - 1

    def kv_per_cell(self, layer: int, bytes_per_value: float = 2.0) -> float:
        """K and V bytes of one cell of `layer`."""
        return self.n_head_kv[layer] * (self.head_k + self.head_v) * bytes_per_value


@attrs.frozen
class LoadOptions:
    """What llama-server is started with that decides its memory."""

    n_ctx: int = 0
    """`-c` (0: the model's trained context)."""
    n_parallel: int = 1
    """`-np`: slots; with `unified` one KV stream for all, else one each."""
    unified: bool = True
    """The server chose its slots itself (`-np` not given): one KV stream."""
    n_ubatch: int = N_UBATCH
    n_gpu_layers: int | None = None
    """`-ngl` (None: every layer, as `--fit` keeps them when they fit)."""
    flash_attn: bool = True
    kv_bytes: float = 2.0
    """Bytes per K/V value (`--cache-type-k/-v`; f16)."""
    on_gpu: bool = True
    """False: a CPU build, or `-ngl 0`/`-dev none`: nothing on the card, no CUDA context."""


@attrs.frozen
class LoadSize:
    """What one llama-server process holds for its model."""

    n_ctx: int
    weights: int
    """On the device (on a CPU build: every tensor, in host memory)."""
    kv: int
    compute: int
    context: int
    """The CUDA context (0 on a CPU build)."""

    @property
    def total(self) -> int:
        return self.weights + self.kv + self.compute + self.context


def _pad(n: int, to: int = KV_PAD) -> int:
    return -(-n // to) * to


def load_size(shape: ModelShape, options: LoadOptions) -> LoadSize:
    """The buffers llama-server allocates for `shape` started with `options`."""
    n_ctx = options.n_ctx if options.n_ctx > 0 else shape.n_ctx_train or FIT_MIN_CTX
    streams = 1 if options.unified else max(1, options.n_parallel)
    cells = _pad(max(1, n_ctx // streams)) * streams
    swa_cells = 0
    if shape.n_swa:
        per_stream = shape.n_swa * (max(1, options.n_parallel) if options.unified else 1)
        swa_cells = min(cells, _pad(per_stream + options.n_ubatch) * streams)
    n_layer = shape.n_layer
    offloaded = n_layer + 1 if options.n_gpu_layers is None else options.n_gpu_layers
    offloaded = max(0, min(offloaded, n_layer + 1)) if options.on_gpu else n_layer + 1
    first = n_layer + 1 - offloaded
    # The output layer is the last of the n_layer + 1 (`get_layer_buft_list(n_layer)`): on
    # the GPU as soon as one layer is.
    weights = sum(shape.layer_bytes[first:]) + (shape.output_layer if offloaded > 0 else 0)
    if not options.on_gpu:
        weights = shape.weights
    kv = int(
        sum(
            (swa_cells if shape.is_swa(layer) else cells)
            * shape.kv_per_cell(layer, options.kv_bytes)
            for layer in range(first if options.on_gpu else 0, n_layer)
        )
    )
    compute = compute_bytes(shape, cells // streams, swa_cells // streams, options)
    context = CUDA_CONTEXT if options.on_gpu and offloaded > 0 else 0
    return LoadSize(n_ctx, weights, kv, compute, context)


def compute_bytes(shape: ModelShape, n_kv: int, n_kv_swa: int, options: LoadOptions) -> int:
    """The compute buffer for one micro-batch attending over `n_kv` cells (and `n_kv_swa`
    in the sliding-window layers): see the module's docstring."""
    tokens = options.n_ubatch
    e, ff = shape.n_embd, shape.n_ff
    kv_e = max(shape.n_head_kv, default=0) * max(shape.head_k, shape.head_v)
    ffn = (3 * ff if ff > 2 * e else 2 * ff) + 4 * e
    attention = max(5 * e, 4 * e + 2 * kv_e)
    phase = 4 * tokens * max(ffn, attention)
    masked = (n_kv + n_kv_swa) * tokens
    if options.flash_attn:
        return phase + 2 * masked
    # The attention matrix of every head, with what its softmax and product keep beside it.
    scores = 4 * n_kv * tokens * shape.n_head + 4 * tokens * 6 * e
    return 4 * masked + max(phase, scores)


def fitted(shape: ModelShape, options: LoadOptions, *, ctx_set: bool) -> tuple[LoadSize, LoadSize]:
    """The least and the most a load may take under `--fit`: the floor with the context
    cut to FIT_MIN_CTX (only when the command did not set it), the ceiling as started.
    Layers moved to the CPU are no floor: that load runs, slower, from host memory."""
    ceiling = load_size(shape, options)
    if ctx_set or ceiling.n_ctx <= FIT_MIN_CTX:
        return ceiling, ceiling
    return load_size(shape, attrs.evolve(options, n_ctx=FIT_MIN_CTX)), ceiling


def fit_context(shape: ModelShape, options: LoadOptions, nbytes: int) -> int:
    """The largest context (a multiple of 256, at least FIT_MIN_CTX) whose load fits in
    `nbytes`: what `-c` is set to so that a load stays within a lease."""
    low, high = FIT_MIN_CTX // KV_PAD, max(FIT_MIN_CTX, shape.n_ctx_train) // KV_PAD
    while low < high:
        middle = (low + high + 1) // 2
        if load_size(shape, attrs.evolve(options, n_ctx=middle * KV_PAD)).total <= nbytes:
            low = middle
        else:
            high = middle - 1
    return low * KV_PAD


# -- a model's shape, from its GGUF header or from what a runtime says of it --------------


def _number(value: MetaValue | None) -> int | None:
    """A positive count: a number, or the largest of a per-layer list."""
    if isinstance(value, tuple):
        numbers = [v for v in value if isinstance(v, int | float) and not isinstance(v, bool)]
        value = max(numbers, default=None)
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return int(value) if value > 0 else None


def _per_layer(value: MetaValue | None, n_layer: int, default: int) -> tuple[int, ...]:
    if isinstance(value, tuple) and len(value) == n_layer:
        return tuple(int(v) if isinstance(v, int | float) else default for v in value)
    return (_number(value) or default,) * n_layer


def shape_of(metadata: Mapping[str, MetaValue], tensors: Sequence[TensorInfo]) -> ModelShape | None:
    """A model's shape from its metadata and tensor table (llama.cpp's
    `llama_model::load_hparams` keys); None when they lack what a size needs."""
    arch = metadata.get("general.architecture")
    if not isinstance(arch, str) or not tensors:
        return None

    def key(name: str) -> MetaValue | None:
        return metadata.get(f"{arch}.{name}")

    n_layer = _number(key("block_count"))
    n_embd = _number(key("embedding_length"))
    n_head = _number(key("attention.head_count"))
    if not (n_layer and n_embd and n_head):
        return None
    n_head_kv = _per_layer(key("attention.head_count_kv"), n_layer, n_head)
    head_k = _number(key("attention.key_length")) or n_embd // n_head
    head_v = _number(key("attention.value_length")) or head_k
    n_ff = _number(key("feed_forward_length")) or 4 * n_embd
    experts = _number(key("expert_used_count"))
    expert_ff = _number(key("expert_feed_forward_length"))
    if experts and expert_ff:
        # A mixture of experts runs the chosen experts' feed-forwards side by side.
        n_ff = max(n_ff if key("feed_forward_length") is not None else 0, experts * expert_ff)
    layers = [0] * n_layer
    inputs = outputs = token_embd = 0
    has_output = False
    vocab = 0
    for tensor in tensors:
        layer = tensor.layer
        if layer is not None and layer < n_layer:
            layers[layer] += tensor.nbytes
        elif tensor.name.startswith(INPUT_LAYER):
            inputs += tensor.nbytes
            if tensor.name == "token_embd.weight":
                token_embd = tensor.nbytes
                vocab = tensor.dims[1] if len(tensor.dims) > 1 else 0
        else:
            outputs += tensor.nbytes
            has_output = has_output or tensor.name == "output.weight"
    embedding = key("pooling_type") is not None
    tokens = metadata.get("tokenizer.ggml.tokens")
    n_vocab = _number(key("vocab_size")) or (
        tokens.length if isinstance(tokens, LongArray) else vocab
    )
    pattern = _number(key("attention.sliding_window_pattern")) or SWA_PATTERNS.get(arch, 0)
    n_swa = _number(key("attention.sliding_window")) or (GEMMA2_WINDOW if arch == "gemma2" else 0)
    return ModelShape(
        arch=arch,
        n_layer=n_layer,
        n_embd=n_embd,
        n_ff=n_ff,
        n_head=n_head,
        n_head_kv=n_head_kv,
        head_k=head_k,
        head_v=head_v,
        n_ctx_train=_number(key("context_length")) or 0,
        n_vocab=n_vocab,
        n_swa=n_swa if pattern else 0,
        swa_pattern=pattern,
        layer_bytes=tuple(layers),
        input_bytes=inputs,
        output_bytes=outputs,
        token_embd=token_embd,
        tied=not has_output and not embedding,
        embedding=embedding,
    )


def header_shape(header: GgufHeader) -> ModelShape | None:
    """A model's shape from its GGUF header."""
    return shape_of(header.metadata, header.tensors)
