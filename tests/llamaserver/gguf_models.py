"""Tiny random-weight llama-architecture GGUF files that the real llama-server loads.

The vocabulary is SentencePiece-style (`tokenizer.ggml.model = "llama"`): `<unk>`, `<s>`,
`</s>` and the 256 byte tokens `<0x00>`..`<0xFF>`, so any text tokenizes by byte fallback
(one token per UTF-8 byte, the `▁` space prefix being three). With `fim=True` three more
control tokens, `<fim_prefix>`, `<fim_suffix>` and `<fim_middle>` (named by the
`tokenizer.ggml.fim_*_token_id` keys too), make `/infill` usable.

The weights are random, but the output layer is shaped so generation is countable: one
residual dimension carries a constant positive value through every layer (the embedding
sets it, the attention and feed-forward outputs never write it), and the output rows of
every token that is not printable ASCII weigh it strongly negative. So the model never
samples end-of-sequence, a control token or a partial UTF-8 byte: `n_predict: N` yields
N tokens and N characters of printable ASCII, whatever the sampler's seed.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import gguf
import numpy as np

# A ChatML template: what llama-server itself falls back to without one, written out so the
# file says what it is. Its markers are plain text to this vocabulary (byte tokens).
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

UNK_ID, BOS_ID, EOS_ID = 0, 1, 2
BYTE_BASE = 3  # token id of <0x00>
FIM_TOKENS = ("<fim_prefix>", "<fim_suffix>", "<fim_middle>")
PRINTABLE = range(0x20, 0x7F)  # the bytes the model may emit
# The residual dimension that stays positive, and how hard banned tokens are pushed down.
_ANCHOR_DIM = 0
_ANCHOR_VALUE = 1.0
_BAN_WEIGHT = -1024.0


def vocabulary(*, fim: bool = False) -> tuple[list[str], list[int]]:
    """The token texts and token types (gguf.TokenType) of the tiny vocabulary."""
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    types = [gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL]
    types += [gguf.TokenType.BYTE] * 256
    if fim:
        tokens += list(FIM_TOKENS)
        types += [gguf.TokenType.CONTROL] * len(FIM_TOKENS)
    return tokens, [int(t) for t in types]


def write_tiny_llama(
    path: Path,
    *,
    n_layer: int = 2,
    n_embd: int = 64,
    n_head: int = 4,
    n_head_kv: int = 2,
    n_ff: int = 128,
    context_length: int = 512,
    seed: int = 0,
    name: str | None = None,
    embedding: bool = False,
    fim: bool = False,
) -> Path:
    """Write a tiny llama GGUF to `path` (f16 matrices, f32 norms) and return the path.

    `embedding=True` records mean pooling (`llama.pooling_type`), which llama-server needs
    to answer `/v1/embeddings` when started with `--embeddings`.
    """
    if n_embd % n_head or n_head % n_head_kv:
        raise ValueError("n_embd must divide by n_head, and n_head by n_head_kv")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    tokens, types = vocabulary(fim=fim)
    n_vocab = len(tokens)
    head_dim = n_embd // n_head
    n_embd_kv = head_dim * n_head_kv

    def matrix(rows: int, cols: int, scale: float = 0.2) -> np.ndarray:
        return (rng.standard_normal((rows, cols)) * scale).astype(np.float32)

    def ones(n: int) -> np.ndarray:
        return np.ones(n, dtype=np.float32)

    def no_anchor(out: np.ndarray) -> np.ndarray:
        out[_ANCHOR_DIM, :] = 0.0  # a layer output never writes the anchor dimension
        return out

    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name(name or path.stem)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    writer.add_context_length(context_length)
    writer.add_embedding_length(n_embd)
    writer.add_block_count(n_layer)
    writer.add_feed_forward_length(n_ff)
    writer.add_head_count(n_head)
    writer.add_head_count_kv(n_head_kv)
    writer.add_rope_dimension_count(head_dim)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(n_vocab)
    if embedding:
        writer.add_pooling_type(gguf.PoolingType.MEAN)

    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores([0.0] * n_vocab)
    writer.add_token_types(types)
    writer.add_bos_token_id(BOS_ID)
    writer.add_eos_token_id(EOS_ID)
    writer.add_unk_token_id(UNK_ID)
    writer.add_add_bos_token(True)
    writer.add_add_eos_token(False)
    writer.add_chat_template(CHAT_TEMPLATE)
    if fim:
        # llama.cpp would also find them by their text; the ids say so explicitly
        fim_keys = (gguf.Keys.Tokenizer.FIM_PRE_ID, gguf.Keys.Tokenizer.FIM_SUF_ID)
        fim_keys += (gguf.Keys.Tokenizer.FIM_MID_ID,)
        for key, token in zip(fim_keys, FIM_TOKENS, strict=True):
            writer.add_uint32(key, tokens.index(token))

    token_embd = matrix(n_vocab, n_embd)
    token_embd[:, _ANCHOR_DIM] = _ANCHOR_VALUE
    output = matrix(n_vocab, n_embd)
    allowed = [BYTE_BASE + b for b in PRINTABLE]
    banned = np.setdiff1d(np.arange(n_vocab), allowed)
    output[banned, :] = 0.0
    output[banned, _ANCHOR_DIM] = _BAN_WEIGHT
    output[allowed, _ANCHOR_DIM] = 0.0

    writer.add_tensor("token_embd.weight", token_embd.astype(np.float16))
    writer.add_tensor("output_norm.weight", ones(n_embd))
    writer.add_tensor("output.weight", output.astype(np.float16))
    for i in range(n_layer):
        blk = f"blk.{i}"
        writer.add_tensor(f"{blk}.attn_norm.weight", ones(n_embd))
        writer.add_tensor(f"{blk}.attn_q.weight", matrix(n_embd, n_embd).astype(np.float16))
        writer.add_tensor(f"{blk}.attn_k.weight", matrix(n_embd_kv, n_embd).astype(np.float16))
        writer.add_tensor(f"{blk}.attn_v.weight", matrix(n_embd_kv, n_embd).astype(np.float16))
        attn_out = no_anchor(matrix(n_embd, n_embd))
        writer.add_tensor(f"{blk}.attn_output.weight", attn_out.astype(np.float16))
        writer.add_tensor(f"{blk}.ffn_norm.weight", ones(n_embd))
        writer.add_tensor(f"{blk}.ffn_gate.weight", matrix(n_ff, n_embd).astype(np.float16))
        writer.add_tensor(f"{blk}.ffn_up.weight", matrix(n_ff, n_embd).astype(np.float16))
        ffn_down = no_anchor(matrix(n_embd, n_ff))
        writer.add_tensor(f"{blk}.ffn_down.weight", ffn_down.astype(np.float16))

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def write_models_dir(
    dir: Path, names: Sequence[str], *, embedding: bool = False, fim: bool = False
) -> list[Path]:
    """One `NAME.gguf` per name in `dir`, as router mode's `--models-dir` lists them.

    llama-server names a top-level `X.gguf` file `X`; a sub-directory `X/` holding one
    model file (plus an optional `*mmproj*.gguf` projector) is also model `X`, and a
    top-level file whose name contains `mmproj` is skipped (common/preset.cpp). Each model
    gets its own seed, so their outputs differ.
    """
    dir = Path(dir)
    dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for seed, name in enumerate(names):
        if "/" in name or "mmproj" in name or not name:
            raise ValueError(f"{name!r} would not be listed as a model by --models-dir")
        paths.append(
            write_tiny_llama(
                dir / f"{name}.gguf", seed=seed, name=name, embedding=embedding, fim=fim
            )
        )
    return paths
