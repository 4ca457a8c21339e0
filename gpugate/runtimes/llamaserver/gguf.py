"""What a GGUF file says of the memory its model takes once llama-server loads it.

Only the header is read: the key/value metadata and the tensor table, never the weights.
The format (ggml/docs/gguf.md, gguf-py/gguf/constants.py): magic `GGUF`, version 2 or 3,
tensor count and metadata count as uint64, then typed key/values, then per tensor its
name, dimensions, ggml type and offset. A tensor's bytes follow from its type's block size.
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import BinaryIO

import attrs

MAGIC = b"GGUF"
HEADER_LIMIT = 64 << 20
"""The most header the gate reads (a vocabulary of 256k tokens is about 10 MiB)."""

# ggml_type → (block elements, block bytes); ggml/src/ggml.c type_traits.
TYPE_SIZES: dict[int, tuple[int, int]] = {
    0: (1, 4),  # F32
    1: (1, 2),  # F16
    2: (32, 18),  # Q4_0
    3: (32, 20),  # Q4_1
    6: (32, 22),  # Q5_0
    7: (32, 24),  # Q5_1
    8: (32, 34),  # Q8_0
    9: (32, 36),  # Q8_1
    10: (256, 84),  # Q2_K
    11: (256, 110),  # Q3_K
    12: (256, 144),  # Q4_K
    13: (256, 176),  # Q5_K
    14: (256, 210),  # Q6_K
    15: (256, 292),  # Q8_K
    16: (256, 66),  # IQ2_XXS
    17: (256, 74),  # IQ2_XS
    18: (256, 98),  # IQ3_XXS
    19: (256, 50),  # IQ1_S
    20: (32, 18),  # IQ4_NL
    21: (256, 110),  # IQ3_S
    22: (256, 82),  # IQ2_S
    23: (256, 136),  # IQ4_XS
    24: (1, 1),  # I8
    25: (1, 2),  # I16
    26: (1, 4),  # I32
    27: (1, 8),  # I64
    28: (1, 8),  # F64
    29: (256, 56),  # IQ1_M
    30: (1, 2),  # BF16
    34: (256, 54),  # TQ1_0
    35: (256, 66),  # TQ2_0
    39: (32, 17),  # MXFP4
}

# GGUF metadata value types: gguf_type in ggml/include/gguf.h.
_SCALARS = {
    0: "<B",
    1: "<b",
    2: "<H",
    3: "<h",
    4: "<I",
    5: "<i",
    6: "<f",
    7: "<?",
    10: "<Q",
    11: "<q",
    12: "<d",
}
_STRING, _ARRAY = 8, 9


class GgufError(ValueError):
    """The file is not a GGUF file the gate can read."""


@attrs.frozen
class GgufFacts:
    """What the header says: the architecture's shape and the weights' bytes."""

    architecture: str
    weights: int
    """Bytes of all tensors as stored (what is offloaded with every layer on the GPU)."""
    n_layer: int
    n_embd: int
    n_head: int
    n_head_kv: int
    context_length: int
    key_length: int | None = None
    value_length: int | None = None

    def kv_cache_bytes(self, n_ctx: int, *, bytes_per_value: int = 2) -> int:
        """The KV cache for `n_ctx` tokens in f16 (llama-server's default cache type):
        n_layer × n_ctx × (n_embd_k_gqa + n_embd_v_gqa) × 2."""
        head_dim = self.n_embd // max(1, self.n_head)
        k = (self.key_length or head_dim) * self.n_head_kv
        v = (self.value_length or head_dim) * self.n_head_kv
        return self.n_layer * n_ctx * (k + v) * bytes_per_value


class _Reader:
    def __init__(self, stream: BinaryIO) -> None:
        self.stream = stream
        self.read_bytes = 0

    def take(self, n: int) -> bytes:
        self.read_bytes += n
        if self.read_bytes > HEADER_LIMIT:
            raise GgufError(f"header longer than {HEADER_LIMIT} bytes")
        data = self.stream.read(n)
        if len(data) != n:
            raise GgufError("file ends inside its header")
        return data

    def unpack(self, fmt: str) -> int | float | bool:
        return struct.unpack(fmt, self.take(struct.calcsize(fmt)))[0]

    def string(self) -> str:
        return self.take(int(self.unpack("<Q"))).decode("utf-8", "replace")

    def value(self, kind: int) -> object:
        if kind in _SCALARS:
            return self.unpack(_SCALARS[kind])
        if kind == _STRING:
            return self.string()
        if kind == _ARRAY:
            item, count = int(self.unpack("<I")), int(self.unpack("<Q"))
            if item in _SCALARS:
                # Arrays (token scores, types) are skipped: only their length matters here.
                self.take(struct.calcsize(_SCALARS[item]) * count)
                return count
            for _ in range(count):
                self.value(item)
            return count
        raise GgufError(f"unknown metadata type {kind}")


def tensor_bytes(kind: int, dims: tuple[int, ...]) -> int:
    """Bytes a tensor of ggml type `kind` and shape `dims` takes as stored."""
    block, size = TYPE_SIZES.get(kind, (1, 2))
    elements = 1
    for d in dims:
        elements *= d
    return elements // block * size


def read_facts(stream: BinaryIO) -> GgufFacts:
    """The facts of a GGUF header; GgufError when the stream is not one."""
    reader = _Reader(stream)
    if reader.take(4) != MAGIC:
        raise GgufError("not a GGUF file (no GGUF magic)")
    version = reader.unpack("<I")
    if version not in (2, 3):
        raise GgufError(f"GGUF version {version} is not read (2 or 3)")
    n_tensors, n_kv = int(reader.unpack("<Q")), int(reader.unpack("<Q"))
    meta: dict[str, object] = {}
    for _ in range(n_kv):
        key = reader.string()
        meta[key] = reader.value(int(reader.unpack("<I")))
    weights = 0
    for _ in range(n_tensors):
        reader.string()
        dims = tuple(int(reader.unpack("<Q")) for _ in range(int(reader.unpack("<I"))))
        kind = int(reader.unpack("<I"))
        reader.unpack("<Q")
        weights += tensor_bytes(kind, dims)
    arch = str(meta.get("general.architecture", "llama"))

    def number(name: str, default: int | None) -> int | None:
        value = meta.get(f"{arch}.{name}")
        return (
            int(value)
            if isinstance(value, (int, float)) and not isinstance(value, bool)
            else default
        )

    n_head = number("attention.head_count", 1) or 1
    return GgufFacts(
        architecture=arch,
        weights=weights,
        n_layer=number("block_count", 0) or 0,
        n_embd=number("embedding_length", 0) or 0,
        n_head=n_head,
        n_head_kv=number("attention.head_count_kv", n_head) or n_head,
        context_length=number("context_length", 4096) or 4096,
        key_length=number("attention.key_length", None),
        value_length=number("attention.value_length", None),
    )


def file_facts(path: Path) -> GgufFacts:
    """The facts of the GGUF file at `path`; OSError or GgufError."""
    with path.open("rb") as stream:
        return read_facts(stream)
