"""A real model file, read as whisper.cpp 1.8.5's `whisper_model_load` (src/whisper.cpp) reads
it, far enough to know whether it loads and what it is.

The file: ggml's magic, eleven int32 hparams, the mel filters, the vocabulary, then tensors
(each: n_dims, name length, type, extents, name, data) until the end of the file. The model
loads when it holds no tensor at all ("assuming empty model for testing") or every tensor
its hparams declare, by name (`ASR_TENSOR_NAMES` in src/whisper-arch.h): 11, plus 15 per
encoder layer and 24 per decoder layer. A tensor whose header was read counts even if its
data ends early (the loader counts it before it finds the end). `n_vocab` of 51865 and up
makes it multilingual (`whisper_vocab::is_multilingual`). Shapes and types are not checked.
"""

from __future__ import annotations

import io
import os
import stat
import struct
from typing import BinaryIO

import attrs

GGML_MAGIC = 0x67676D6C
MULTILINGUAL_VOCAB = 51865
_ENCODER = ("positional_embedding", "conv1.weight", "conv1.bias", "conv2.weight", "conv2.bias",
            "ln_post.weight", "ln_post.bias")  # fmt: skip
_DECODER = ("positional_embedding", "token_embedding.weight", "ln.weight", "ln.bias")
_MLP_ATTN = ("mlp_ln.weight", "mlp_ln.bias", "mlp.0.weight", "mlp.0.bias", "mlp.2.weight",
             "mlp.2.bias", "attn_ln.weight", "attn_ln.bias")  # fmt: skip
_ATTENTION = ("query.weight", "query.bias", "key.weight", "value.weight", "value.bias",
              "out.weight", "out.bias")  # fmt: skip
# ggml type → (block size, bytes per block), the types a whisper model file holds.
_TYPES = {0: (1, 4), 1: (1, 2), 2: (32, 18), 3: (32, 20), 6: (32, 22), 7: (32, 24),
          8: (32, 34), 10: (256, 84), 11: (256, 110), 12: (256, 144), 13: (256, 176),
          14: (256, 210)}  # fmt: skip


class BadModel(Exception):
    """whisper_model_load fails; str() is the line it logs."""


@attrs.frozen
class ModelFile:
    size: int
    """Bytes in the file."""
    multilingual: bool


def expected_tensors(audio_layers: int, text_layers: int) -> set[str]:
    names = {f"encoder.{n}" for n in _ENCODER} | {f"decoder.{n}" for n in _DECODER}
    for i in range(audio_layers):
        names |= {f"encoder.blocks.{i}.{n}" for n in _MLP_ATTN}
        names |= {f"encoder.blocks.{i}.attn.{n}" for n in _ATTENTION}
    for i in range(text_layers):
        names |= {f"decoder.blocks.{i}.{n}" for n in _MLP_ATTN}
        names |= {f"decoder.blocks.{i}.attn.{n}" for n in _ATTENTION}
        names |= {f"decoder.blocks.{i}.cross_attn_ln.{w}" for w in ("weight", "bias")}
        names |= {f"decoder.blocks.{i}.cross_attn.{n}" for n in _ATTENTION}
    return names


def read_model(path: str) -> ModelFile:
    """Open `path` as whisper.cpp does (a pipe is read to its end) and check it loads;
    BadModel when it does not, OSError when it does not open."""
    with open(path, "rb") as raw:
        if stat.S_ISREG(os.fstat(raw.fileno()).st_mode):
            return _read(raw, os.fstat(raw.fileno()).st_size)
        data = raw.read()
    return _read(io.BytesIO(data), len(data))


def _ints(f: BinaryIO, count: int) -> tuple[int, ...]:
    raw = f.read(4 * count)
    if len(raw) < 4 * count:
        raise EOFError
    return struct.unpack(f"<{count}i", raw)


def _read(f: BinaryIO, size: int) -> ModelFile:
    try:
        (magic,) = struct.unpack("<I", f.read(4) or b"\0\0\0\0")
    except (struct.error, OSError):
        magic = 0
    if magic != GGML_MAGIC:
        raise BadModel("whisper_model_load: invalid model data (bad magic)")
    try:
        hparams = _ints(f, 11)
        n_mel, n_fft = _ints(f, 2)
        f.seek(4 * n_mel * n_fft, io.SEEK_CUR)
        (words,) = _ints(f, 1)
        for _ in range(words):
            (length,) = _ints(f, 1)
            f.seek(length, io.SEEK_CUR)
    except (EOFError, ValueError, OSError):
        raise BadModel("whisper_model_load: ERROR not all tensors loaded from model file") from None
    n_vocab, audio_layers, text_layers = hparams[0], hparams[4], hparams[8]
    declared = expected_tensors(audio_layers, text_layers)
    loaded = 0
    while f.tell() < size:
        try:
            n_dims, length, ttype = _ints(f, 3)
            extents = _ints(f, n_dims) if 0 <= n_dims <= 4 else (0,)
        except EOFError:
            break
        name = f.read(length).decode("utf-8", "replace")
        if name not in declared:
            raise BadModel(f"whisper_model_load: unknown tensor '{name}' in model file")
        elements = 1
        for extent in extents:
            elements *= extent
        block, per_block = _TYPES.get(ttype, (1, 4))
        f.seek(elements // block * per_block, io.SEEK_CUR)
        loaded += 1
    if loaded and loaded != len(declared):
        raise BadModel(
            f"whisper_model_load: ERROR not all tensors loaded from model file - "
            f"expected {len(declared)}, got {loaded}"
        )
    return ModelFile(size, n_vocab >= MULTILINGUAL_VOCAB)
