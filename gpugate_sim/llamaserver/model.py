"""What a simulated llama-server knows of its model, read from the GGUF header.

The hyperparameters are the ones llama.cpp reads in `llama_model::load_hparams`
(src/llama-model.cpp): `<arch>.context_length`, `.embedding_length`, `.block_count`,
`.feed_forward_length`, `.attention.head_count`, `.attention.head_count_kv` (a number or
one per layer), `.attention.key_length` / `.value_length` (default: n_embd / n_head),
`.attention.sliding_window` with the architecture's window pattern (gemma2 every second
layer global, gemma3 every sixth: src/models/gemma2.cpp, gemma3.cpp `load_swa_pattern`);
the vocabulary is `tokenizer.ggml.tokens`. A file without `output.weight` uses its token
embeddings as its output layer too, copied to that layer's device (src/models/llama.cpp,
`TENSOR_DUPLICATED`).
"""

from __future__ import annotations

import collections
import math
import os
from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from gpugate_sim.llamaserver.gguf import GgufFile, read_gguf

_FTYPE_NAMES = {
    0: "all F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1",
    10: "Q2_K - Medium", 11: "Q3_K - Small", 12: "Q3_K - Medium", 13: "Q3_K - Large",
    14: "Q4_K - Small", 15: "Q4_K - Medium", 16: "Q5_K - Small", 17: "Q5_K - Medium",
    18: "Q6_K", 21: "Q2_K - Small", 32: "BF16", 38: "MXFP4 MoE",
}  # fmt: skip
"""llama_ftype_name (src/llama-model-loader.cpp) for the common file types."""
_TENSOR_FTYPE = {0: 0, 1: 1, 30: 32, 2: 2, 3: 3, 6: 8, 7: 9, 8: 7, 10: 10, 11: 12, 12: 15,
                 13: 17, 14: 18}  # fmt: skip
"""ggml tensor type → the file type llama.cpp guesses from the most common one."""
_VOCAB_TYPES = {"no_vocab": 0, "llama": 1, "gpt2": 2, "t5": 3, "bert": 4, "rwkv": 5, "plamo2": 6}
"""enum llama_vocab_type (include/llama.h) by tokenizer.ggml.model."""
_POOLING = {"none": 0, "mean": 1, "cls": 2, "last": 3, "rank": 4}
_SWA_PERIODS = {"gemma2": 2, "gemma3": 6}
"""The sliding-window period of the architectures with one (`load_swa_pattern`)."""


def ftype_name(gguf: GgufFile) -> str:
    """`llama_ftype_name` of the file's type, guessed (and said so) when it has none."""
    code = gguf.get("general.file_type")
    if code is not None:
        return _FTYPE_NAMES.get(int(code), "unknown, may not work")
    counts = collections.Counter(t.type for t in gguf.tensors if t.dims and len(t.dims) > 1)
    if not counts:
        return "(guessed) all F32"
    common = counts.most_common(1)[0][0]
    guessed = _TENSOR_FTYPE.get(common)
    name = _FTYPE_NAMES.get(guessed, "unknown, may not work") if guessed is not None else None
    return f"(guessed) {name or 'unknown, may not work'}"


@attrs.frozen
class ModelInfo:
    """A model file's shape, as llama.cpp reads it."""

    path: str
    arch: str
    name: str
    n_layer: int
    n_ctx_train: int
    n_embd: int
    n_head: int
    n_head_kv: tuple[int, ...]
    """Per layer."""
    n_embd_head_k: int
    n_embd_head_v: int
    n_ff: int
    n_swa: int
    """The sliding window of the layers that have one (0: no layer has)."""
    swa_period: int
    """Layers per sliding-window period, the last of them global."""
    tokens: tuple[str, ...]
    vocab_type: int
    bos: int | None
    eos: int | None
    add_bos: bool
    fim: tuple[int | None, ...]
    """The FIM token ids (fim_tokens): prefix, suffix and middle, which /infill needs, then
    repository and file separator; None for each the model has not."""
    pooling: int | None
    """`<arch>.pooling_type` when the file says (embedding models)."""
    ftype: str
    n_params: int
    size: int
    """Bytes of all tensors (llama_model_size)."""
    layer_bytes: tuple[int, ...]
    """Bytes of each repeating layer's tensors."""
    output_bytes: int
    """Bytes of the output layer (output_norm, output; the token embeddings' copy where the
    file has no output matrix): what llama.cpp puts on the output layer's device."""
    input_bytes: int
    """Bytes of the input layer (token embeddings: always kept in host memory)."""
    file_size: int

    @property
    def n_vocab(self) -> int:
        return len(self.tokens)

    def is_swa(self, layer: int) -> bool:
        """`llama_hparams::set_swa_pattern` (dense last): all but the period's last."""
        period = self.swa_period
        return self.n_swa > 0 and period > 0 and layer % period < period - 1

    def kv_bytes_per_token(self, layers: int | None = None, bytes_per_value: int = 2) -> int:
        """K and V cache bytes per token of context for the last `layers` layers (all when
        None): n_embd_k_gqa + n_embd_v_gqa values a layer, f16 by default."""
        chosen = self.n_head_kv[self.n_layer - (self.n_layer if layers is None else layers) :]
        per_layer = [h * (self.n_embd_head_k + self.n_embd_head_v) for h in chosen]
        return sum(per_layer) * bytes_per_value


class NotAModel(Exception):
    """The path opens but llama.cpp could not load a model from it."""


def _arch_value(gguf: GgufFile, arch: str, key: str, default: Any = None) -> Any:
    return gguf.get(f"{arch}.{key}", default)


def _largest(value: Any, default: int) -> int:
    """A count, or the largest of a per-layer list."""
    if isinstance(value, list):
        value = max((int(v) for v in value), default=0)
    return int(value) if value else default


def _per_layer(value: Any, n_layer: int, default: int) -> tuple[int, ...]:
    if isinstance(value, list):
        return tuple(int(v) for v in value[:n_layer]) + (default,) * max(0, n_layer - len(value))
    return (int(value if value is not None else default),) * n_layer


def load_model_info(path: str | os.PathLike[str]) -> ModelInfo:
    """Read `path`'s header; OSError when it does not open, NotAModel when it is no model."""
    from gpugate_sim.llamaserver.gguf import NotGguf

    try:
        gguf = read_gguf(path)
    except NotGguf as exc:
        raise NotAModel(f"{path}: {exc}") from None
    arch = str(gguf.get("general.architecture", ""))
    if not arch:
        raise NotAModel(f"{path}: no general.architecture")
    n_layer = int(_arch_value(gguf, arch, "block_count", 0))
    n_embd = int(_arch_value(gguf, arch, "embedding_length", 0))
    head = _arch_value(gguf, arch, "attention.head_count", 0)
    n_head = int(head[0] if isinstance(head, list) else head) or 1
    n_head_kv = _per_layer(_arch_value(gguf, arch, "attention.head_count_kv"), n_layer, n_head)
    head_k = int(_arch_value(gguf, arch, "attention.key_length", n_embd // n_head))
    head_v = int(_arch_value(gguf, arch, "attention.value_length", n_embd // n_head))
    tokens = tuple(str(t) for t in gguf.get("tokenizer.ggml.tokens", []))
    layers = [0] * n_layer
    output = inputs = 0
    has_output = False
    for tensor in gguf.tensors:
        layer = tensor.layer
        if layer is not None and layer < n_layer:
            layers[layer] += tensor.nbytes
        elif tensor.name.startswith(("token_embd.", "position_embd.", "token_types.")):
            # The input layer (LLM_TENSOR_LAYER_INPUT, src/llama-arch.cpp).
            inputs += tensor.nbytes
        else:
            output += tensor.nbytes
            has_output = has_output or tensor.name == "output.weight"
    pooling = _arch_value(gguf, arch, "pooling_type")
    if not has_output and pooling is None:
        output += next((t.nbytes for t in gguf.tensors if t.name == "token_embd.weight"), 0)
    period = int(_arch_value(gguf, arch, "attention.sliding_window_pattern", 0) or 0)
    period = period or _SWA_PERIODS.get(arch, 0)
    window = int(_arch_value(gguf, arch, "attention.sliding_window", 0) or 0)
    if arch == "gemma2" and not window:
        window = 4096  # its default (src/models/gemma2.cpp)
    bos = gguf.get("tokenizer.ggml.bos_token_id")
    eos = gguf.get("tokenizer.ggml.eos_token_id")
    model = str(gguf.get("tokenizer.ggml.model", "llama"))
    return ModelInfo(
        path=str(path),
        arch=arch,
        name=str(gguf.get("general.name", "")),
        n_layer=n_layer,
        n_ctx_train=int(_arch_value(gguf, arch, "context_length", 0)),
        n_embd=n_embd,
        n_head=n_head,
        n_head_kv=n_head_kv,
        n_embd_head_k=head_k,
        n_embd_head_v=head_v,
        n_ff=_largest(_arch_value(gguf, arch, "feed_forward_length"), 4 * n_embd),
        n_swa=window if period else 0,
        swa_period=period,
        tokens=tokens,
        vocab_type=_VOCAB_TYPES.get(model, 1),
        bos=None if bos is None else int(bos),
        eos=None if eos is None else int(eos),
        add_bos=bool(gguf.get("tokenizer.ggml.add_bos_token", model == "llama")),
        fim=fim_tokens(gguf, tokens),
        pooling=None if pooling is None else int(pooling),
        ftype=ftype_name(gguf),
        n_params=sum(math.prod(t.dims) for t in gguf.tensors),
        size=gguf.tensor_bytes,
        layer_bytes=tuple(layers),
        output_bytes=output,
        input_bytes=inputs,
        file_size=gguf.file_size,
    )


_FIM_KEYS = (("fim_pre", "prefix"), ("fim_suf", "suffix"), ("fim_mid", "middle"), ("fim_rep",),
             ("fim_sep",))  # fmt: skip
"""`tokenizer.ggml.<key>_token_id`: the current key, then the deprecated one (which wins)."""
_FIM_TEXTS = (
    ("<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<｜fim▁begin｜>", "<PRE>", "▁<PRE>",
     "<|code_prefix|>", "<|prefix|>"),
    ("<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<｜fim▁hole｜>", "<SUF>", "▁<SUF>",
     "<|code_suffix|>", "<|suffix|>"),
    ("<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<｜fim▁end｜>", "<MID>", "▁<MID>",
     "<|code_middle|>", "<|middle|>"),
    ("<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"),
    ("<|file_sep|>",),
)  # fmt: skip
"""The token texts llama_vocab::impl::load takes for each FIM token without a key."""


def fim_tokens(gguf: GgufFile, tokens: Sequence[str]) -> tuple[int | None, ...]:
    """The FIM prefix, suffix, middle, repository and file-separator token ids as
    src/llama-vocab.cpp finds them: by the metadata keys (an id out of the vocabulary is
    ignored), else by the token's text (the first text of the list present; llama.cpp walks
    an unordered map, so which of several would win there is unspecified)."""
    ids = {text: i for i, text in enumerate(tokens)}  # token_to_id: a repeated text's last id
    found: list[int | None] = []
    for keys, texts in zip(_FIM_KEYS, _FIM_TEXTS, strict=True):
        token = None
        for key in keys:
            value = gguf.get(f"tokenizer.ggml.{key}_token_id")
            if isinstance(value, int) and 0 <= value < len(tokens):
                token = value
        if token is None:
            token = next((ids[text] for text in texts if text in ids), None)
        found.append(token)
    return tuple(found)


def pooling_from_option(value: str | None) -> int | None:
    """`--pooling` → enum llama_pooling_type; None when unset."""
    return None if value is None else _POOLING[value]


def layer_sum(sizes: Sequence[int], last: int) -> int:
    """Bytes of the last `last` entries of `sizes`."""
    return sum(sizes[len(sizes) - last :]) if last > 0 else 0


def with_weights(info: ModelInfo, nbytes: int) -> ModelInfo:
    """`info` with weights of `nbytes` on the GPU when fully offloaded (a sim-only size,
    `--sim-model-size`): the repeating layers and the output layer scaled to that total in
    their file's proportions (evenly when the file has none), the remainder of the
    rounding on the output layer. The token embeddings, which stay in host memory, and
    everything the KV cache and compute buffer are sized from are kept."""
    parts = [*info.layer_bytes, info.output_bytes]
    total = sum(parts)
    if total > 0:
        scaled = [nbytes * part // total for part in parts]
    else:
        scaled = [nbytes // len(parts)] * len(parts)
    scaled[-1] += nbytes - sum(scaled)
    return attrs.evolve(
        info,
        layer_bytes=tuple(scaled[:-1]),
        output_bytes=scaled[-1],
        size=info.input_bytes + nbytes,
    )


def sized_for(sizes: Mapping[str, int], path: str) -> int | None:
    """The size `sizes` gives the model file `path`: by the path as given, else by its
    file name; None when it gives none."""
    for key in (path, os.path.basename(path)):
        if key in sizes:
            return sizes[key]
    return None
