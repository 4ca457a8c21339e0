"""Tiny whisper models in ggml's legacy file format, with random weights, for whisper-server.

The layout is what whisper.cpp 1.8.5 reads in `src/whisper.cpp` `whisper_model_load`:

1. the magic `GGML_FILE_MAGIC` (0x67676d6c, `ggml/include/ggml.h`) as a little-endian u32;
2. eleven i32 hparams: n_vocab, n_audio_ctx, n_audio_state, n_audio_head, n_audio_layer,
   n_text_ctx, n_text_state, n_text_head, n_text_layer, n_mels, ftype (n_text_state must
   equal n_audio_state: an assert);
3. the mel filters: i32 n_mel, i32 n_fft, then n_mel*n_fft f32 (`log_mel_spectrogram`
   asserts n_fft == 1 + WHISPER_N_FFT/2 = 201);
4. the vocabulary: i32 count, then per token a u32 length and its bytes; the ids from count
   to n_vocab are made up by the loader (`[_extra_token_N]`, `[_EOT_]`, ...). n_vocab
   decides the language: 51864 is English-only, 51865 and up multilingual
   (`whisper_vocab::is_multilingual`);
5. the tensors, each: i32 n_dims, i32 name length, i32 ggml type, n_dims i32 extents
   (ggml's ne order, innermost first), the name, then the data. Every tensor the model
   declares must come, with its exact shape (`not all tensors loaded` otherwise); names
   and shapes are those of `whisper-arch.h` `ASR_TENSOR_NAMES` and the loader's
   `create_tensor` calls.

Random weights give random tokens: the text is nonsense, but the server transcribes,
times and answers as it would with a real model.
"""

from __future__ import annotations

import struct
from pathlib import Path

import attrs
import numpy as np

GGML_FILE_MAGIC = 0x67676D6C
N_FFT = 201
N_VOCAB_ENGLISH = 51864
N_VOCAB_MULTILINGUAL = 51865
F32 = 0
F16 = 1
DEFAULT_VOCAB = (" ", *(f" w{i}" for i in range(255)))
"""The first token ids' text. `whisper_process_logits` looks up the token " " (suppress
blank) with `token_to_id.at`: a vocabulary without it fails every transcription."""


@attrs.frozen
class Dims:
    """A model's hparams; the defaults are about the smallest that load and transcribe."""

    n_vocab: int = N_VOCAB_ENGLISH
    n_audio_ctx: int = 16
    n_state: int = 8
    n_head: int = 2
    n_audio_layer: int = 1
    n_text_ctx: int = 16
    n_text_layer: int = 1
    n_mels: int = 80
    ftype: int = F16

    @property
    def hparams(self) -> tuple[int, ...]:
        return (
            self.n_vocab,
            self.n_audio_ctx,
            self.n_state,
            self.n_head,
            self.n_audio_layer,
            self.n_text_ctx,
            self.n_state,
            self.n_head,
            self.n_text_layer,
            self.n_mels,
            self.ftype,
        )


def _attention(prefix: str, n: int, wide: bool) -> list[tuple[str, tuple[int, ...], bool]]:
    """An attention block's tensors: (name, ne, is a big matrix stored in the weight type)."""
    return [
        (f"{prefix}.query.weight", (n, n), wide),
        (f"{prefix}.query.bias", (n,), False),
        (f"{prefix}.key.weight", (n, n), wide),
        (f"{prefix}.value.weight", (n, n), wide),
        (f"{prefix}.value.bias", (n,), False),
        (f"{prefix}.out.weight", (n, n), wide),
        (f"{prefix}.out.bias", (n,), False),
    ]


def _block(prefix: str, n: int, *, cross: bool) -> list[tuple[str, tuple[int, ...], bool]]:
    tensors = [
        (f"{prefix}.mlp_ln.weight", (n,), False),
        (f"{prefix}.mlp_ln.bias", (n,), False),
        (f"{prefix}.mlp.0.weight", (n, 4 * n), True),
        (f"{prefix}.mlp.0.bias", (4 * n,), False),
        (f"{prefix}.mlp.2.weight", (4 * n, n), True),
        (f"{prefix}.mlp.2.bias", (n,), False),
        (f"{prefix}.attn_ln.weight", (n,), False),
        (f"{prefix}.attn_ln.bias", (n,), False),
        *_attention(f"{prefix}.attn", n, True),
    ]
    if cross:
        tensors += [
            (f"{prefix}.cross_attn_ln.weight", (n,), False),
            (f"{prefix}.cross_attn_ln.bias", (n,), False),
            *_attention(f"{prefix}.cross_attn", n, True),
        ]
    return tensors


def tensor_layout(dims: Dims) -> list[tuple[str, tuple[int, ...], int]]:
    """Every tensor `whisper_model_load` declares for `dims`: (name, ne, ggml type)."""
    n = dims.n_state
    wide = dims.ftype
    conv = F32 if dims.ftype == F32 else F16  # the loader's `vtype`
    plan: list[tuple[str, tuple[int, ...], bool | int]] = [
        ("encoder.positional_embedding", (n, dims.n_audio_ctx), False),
        ("encoder.conv1.weight", (3, dims.n_mels, n), -1),
        ("encoder.conv1.bias", (1, n), False),
        ("encoder.conv2.weight", (3, n, n), -1),
        ("encoder.conv2.bias", (1, n), False),
        ("encoder.ln_post.weight", (n,), False),
        ("encoder.ln_post.bias", (n,), False),
    ]
    for layer in range(dims.n_audio_layer):
        plan += _block(f"encoder.blocks.{layer}", n, cross=False)
    plan += [
        ("decoder.positional_embedding", (n, dims.n_text_ctx), False),
        ("decoder.token_embedding.weight", (n, dims.n_vocab), True),
        ("decoder.ln.weight", (n,), False),
        ("decoder.ln.bias", (n,), False),
    ]
    for layer in range(dims.n_text_layer):
        plan += _block(f"decoder.blocks.{layer}", n, cross=True)
    layout = []
    for name, ne, kind in plan:
        ggml_type = conv if kind == -1 else (wide if kind else F32)
        layout.append((name, ne, ggml_type))
    return layout


def write_model(
    path: Path,
    *,
    dims: Dims | None = None,
    seed: int = 0,
    vocab: tuple[str, ...] = (),
    pad_to: int = 0,
) -> Path:
    """Write a random-weight whisper model to `path`; `pad_to` bytes of vocabulary make
    the file at least that large (a model that takes longer to read)."""
    dims = dims or Dims()
    rng = np.random.default_rng(seed)
    out = bytearray(struct.pack("<I", GGML_FILE_MAGIC))
    out += struct.pack("<11i", *dims.hparams)
    out += struct.pack("<ii", dims.n_mels, N_FFT)
    filters = rng.random((dims.n_mels, N_FFT), dtype=np.float32) * np.float32(0.01)
    out += filters.astype("<f4").tobytes()
    words = [w.encode() for w in vocab or DEFAULT_VOCAB]
    body = bytearray()
    for word in words:
        body += struct.pack("<I", len(word)) + word
    count = len(words)
    tensors = bytearray()
    for name, ne, ggml_type in tensor_layout(dims):
        raw = name.encode()
        tensors += struct.pack("<iii", len(ne), len(raw), ggml_type)
        tensors += struct.pack(f"<{len(ne)}i", *ne)
        tensors += raw
        values = rng.standard_normal(int(np.prod(ne)), dtype=np.float32) * np.float32(0.2)
        dtype = "<f4" if ggml_type == F32 else "<f2"
        tensors += values.astype(dtype).tobytes()
    short = pad_to - (len(out) + 4 + len(body) + len(tensors))
    while short > 0 and count < dims.n_vocab:
        word = b"p" * min(short, 4096)
        body += struct.pack("<I", len(word)) + word
        count += 1
        short -= 4 + len(word)
    out += struct.pack("<i", count) + body + tensors
    path.write_bytes(bytes(out))
    return path


def write_english(path: Path, seed: int = 0, **kwargs: object) -> Path:
    """An English-only model (n_vocab 51864)."""
    return write_model(path, dims=Dims(n_vocab=N_VOCAB_ENGLISH), seed=seed, **kwargs)  # type: ignore[arg-type]


def write_multilingual(path: Path, seed: int = 0, **kwargs: object) -> Path:
    """A multilingual model (n_vocab 51865)."""
    return write_model(path, dims=Dims(n_vocab=N_VOCAB_MULTILINGUAL), seed=seed, **kwargs)  # type: ignore[arg-type]
