"""The simulated Ollama's model store: a manifest and a GGUF blob for each model with a shape.

Ollama keeps its models under OLLAMA_MODELS (server/modelpath.go, server/images.go):
`manifests/<registry>/<namespace>/<model>/<tag>`, a JSON manifest whose layer of media type
`application/vnd.ollama.image.model` names the weights' blob by digest, and
`blobs/sha256-<hex>`, the GGUF file itself, which /api/show's Modelfile names on its
`FROM` line. The simulator writes both for every model its host file gives a shape
(`head_count` and the other dimensions): the blob is the GGUF header a model of that
architecture has (its metadata and its tensor table, without the vocabulary's strings,
`<arch>.vocab_size` saying how many there are) followed by the tensor data as a hole in a
sparse file, so the file has the model's size on disk and costs nothing.

The tensor table is the one llama.cpp's converter writes for the family
(convert_hf_to_gguf.py, gguf-py/gguf/constants.py `MODEL_TENSORS`): token embeddings, per
layer the attention and feed-forward matrices and their norms, the output norm and, unless
the model ties its embeddings, the output matrix. A `Q4_K_M` file has its output matrix
(the token embeddings where they are tied) in Q6_K, and the V and feed-forward down
projections of the layers `use_more_bits` picks (the first and last eighth, and every
third between) in Q6_K; the rest in Q4_K (src/llama-quant.cpp `llama_tensor_get_type`);
one-dimensional tensors are F32.
"""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

import attrs

from gpugate_sim.scenario import OllamaModelSpec

MODEL_MEDIA_TYPE = "application/vnd.ollama.image.model"
ALIGNMENT = 32
"""general.alignment's default (ggml/src/gguf.cpp)."""

# ggml types (ggml/include/ggml.h) and their (block elements, block bytes).
F32, F16, Q4_0, Q8_0, Q4_K, Q5_K, Q6_K, BF16 = 0, 1, 2, 8, 12, 13, 14, 30
_BLOCKS = {F32: (1, 4), F16: (1, 2), Q4_0: (32, 18), Q8_0: (32, 34), Q4_K: (256, 144),
           Q5_K: (256, 176), Q6_K: (256, 210), BF16: (1, 2)}  # fmt: skip
# quantization_level → (most matrices, the sensitive ones)
_TYPES = {
    "Q4_K_M": (Q4_K, Q6_K), "Q4_K_S": (Q4_K, Q4_K), "Q5_K_M": (Q5_K, Q6_K), "Q6_K": (Q6_K, Q6_K),
    "Q4_0": (Q4_0, Q4_0), "Q8_0": (Q8_0, Q8_0), "F16": (F16, F16), "BF16": (BF16, BF16),
}  # fmt: skip
_FILE_TYPES = {"Q4_K_M": 15, "Q4_K_S": 14, "Q5_K_M": 17, "Q6_K": 18, "Q4_0": 2, "Q8_0": 7,
               "F16": 1, "BF16": 32}  # fmt: skip
"""general.file_type (llama_ftype) of each quantization_level."""


@attrs.frozen
class BlobTensor:
    name: str
    kind: int
    dims: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        block, size = _BLOCKS[self.kind]
        elements = 1
        for d in self.dims:
            elements *= d
        return -(-elements // block) * size


def use_more_bits(layer: int, layers: int) -> bool:
    """src/llama-quant.cpp `use_more_bits`."""
    return layer < layers // 8 or layer >= 7 * layers // 8 or (layer - layers // 8) % 3 == 2


def shaped(spec: OllamaModelSpec) -> bool:
    """Whether the host file gives the model's shape (a blob can be written for it)."""
    return spec.head_count > 0


def _head_dim(spec: OllamaModelSpec) -> int:
    return spec.key_length or spec.embedding_length // spec.head_count


def tensors(spec: OllamaModelSpec) -> list[BlobTensor]:
    """The model's tensor table, as the converter writes it for its family."""
    main, sensitive = _TYPES.get(spec.quantization_level, (Q4_K, Q6_K))
    e = spec.embedding_length
    ff = spec.feed_forward_length or 4 * e
    vocab = spec.vocab_size or 32000
    head = _head_dim(spec)
    q, kv = spec.head_count * head, (spec.head_count_kv or spec.head_count) * head
    tied = spec.tied_embeddings
    table = [BlobTensor("token_embd.weight", sensitive if tied else main, (e, vocab))]
    bert = spec.family == "bert"
    if bert:
        table += [
            BlobTensor("position_embd.weight", main, (e, spec.context_length + 2)),
            BlobTensor("token_types.weight", F32, (e, 1)),
            BlobTensor("token_embd_norm.weight", F32, (e,)),
            BlobTensor("token_embd_norm.bias", F32, (e,)),
        ]
    for i in range(spec.block_count):
        blk = f"blk.{i}"
        more = sensitive if use_more_bits(i, spec.block_count) else main
        table += [
            BlobTensor(f"{blk}.attn_q.weight", main, (e, q)),
            BlobTensor(f"{blk}.attn_k.weight", main, (e, kv)),
            BlobTensor(f"{blk}.attn_v.weight", more, (e, kv)),
            BlobTensor(f"{blk}.attn_output.weight", main, (q, e)),
            BlobTensor(f"{blk}.ffn_up.weight", main, (e, ff)),
            BlobTensor(f"{blk}.ffn_down.weight", more, (ff, e)),
        ]
        if bert:
            table += [BlobTensor(f"{blk}.{n}.bias", F32, (d,)) for n, d in (
                ("attn_q", q), ("attn_k", kv), ("attn_v", kv), ("attn_output", e),
                ("ffn_up", ff), ("ffn_down", e))]  # fmt: skip
            for norm in ("attn_output_norm", "layer_output_norm"):
                table += [BlobTensor(f"{blk}.{norm}.{p}", F32, (e,)) for p in ("weight", "bias")]
            continue
        table += [
            BlobTensor(f"{blk}.ffn_gate.weight", main, (e, ff)),
            BlobTensor(f"{blk}.attn_norm.weight", F32, (e,)),
            BlobTensor(f"{blk}.ffn_norm.weight", F32, (e,)),
        ]
        if spec.family == "qwen2":
            table += [BlobTensor(f"{blk}.{n}.bias", F32, (d,)) for n, d in (
                ("attn_q", q), ("attn_k", kv), ("attn_v", kv))]  # fmt: skip
        if spec.family == "gemma3":
            table += [
                BlobTensor(f"{blk}.attn_q_norm.weight", F32, (head,)),
                BlobTensor(f"{blk}.attn_k_norm.weight", F32, (head,)),
                BlobTensor(f"{blk}.post_attention_norm.weight", F32, (e,)),
                BlobTensor(f"{blk}.post_ffw_norm.weight", F32, (e,)),
            ]
    if not bert:
        table.append(BlobTensor("output_norm.weight", F32, (e,)))
        if not tied:
            table.append(BlobTensor("output.weight", sensitive, (e, vocab)))
    return table


def metadata(spec: OllamaModelSpec) -> dict[str, int | str]:
    """The keys llama.cpp's loader and Ollama read of the model."""
    arch = spec.family
    meta: dict[str, int | str] = {
        "general.architecture": arch,
        "general.name": spec.name,
        "general.file_type": _FILE_TYPES.get(spec.quantization_level, 15),
        "general.quantization_version": 2,
        f"{arch}.block_count": spec.block_count,
        f"{arch}.context_length": spec.context_length,
        f"{arch}.embedding_length": spec.embedding_length,
        f"{arch}.feed_forward_length": spec.feed_forward_length or 4 * spec.embedding_length,
        f"{arch}.attention.head_count": spec.head_count,
        f"{arch}.attention.head_count_kv": spec.head_count_kv or spec.head_count,
        f"{arch}.vocab_size": spec.vocab_size or 32000,
    }
    if spec.key_length:
        meta[f"{arch}.attention.key_length"] = spec.key_length
        meta[f"{arch}.attention.value_length"] = spec.key_length
    if spec.sliding_window:
        meta[f"{arch}.attention.sliding_window"] = spec.sliding_window
    if spec.embedding:
        meta[f"{arch}.pooling_type"] = 2 if arch == "bert" else 1
    if spec.parameter_size:
        meta["general.size_label"] = spec.parameter_size
    return meta


def _string(text: str) -> bytes:
    raw = text.encode()
    return struct.pack("<Q", len(raw)) + raw


def _value(value: int | str) -> bytes:
    if isinstance(value, str):
        return struct.pack("<I", 8) + _string(value)
    return struct.pack("<I", 4) + struct.pack("<I", value)  # uint32


def write_blob(path: Path, spec: OllamaModelSpec) -> int:
    """Write the model's GGUF file at `path` (the data a hole); its size."""
    table = tensors(spec)
    meta = metadata(spec)
    head = bytearray(b"GGUF" + struct.pack("<IQQ", 3, len(table), len(meta)))
    for key, value in meta.items():
        head += _string(key) + _value(value)
    offset = 0
    for tensor in table:
        head += _string(tensor.name) + struct.pack("<I", len(tensor.dims))
        head += b"".join(struct.pack("<Q", d) for d in tensor.dims)
        head += struct.pack("<IQ", tensor.kind, offset)
        offset += -(-tensor.nbytes // ALIGNMENT) * ALIGNMENT
    head += bytes(-len(head) % ALIGNMENT)
    size = len(head) + offset
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".partial")
    with open(tmp, "wb") as stream:
        stream.write(head)
        stream.truncate(size)
    os.replace(tmp, path)
    return size


def write_manifest(
    models_dir: Path, parts: tuple[str, str, str, str], blob: str, size: int
) -> None:
    """`manifests/<host>/<namespace>/<model>/<tag>`, naming the blob as the model layer."""
    host, namespace, model, tag = parts
    path = models_dir / "manifests" / host / namespace / model / tag
    manifest = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
        "layers": [{"mediaType": MODEL_MEDIA_TYPE, "digest": f"sha256:{blob}", "size": size}],
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(manifest))
