"""A GGUF file's header: its metadata and its tensor table, never its weights.

Ollama's blobs and llama-server's models are GGUF files, and what a load of one takes is
written in its header: the architecture's shape in the metadata, the weights' bytes in the
tensor table. The format (ggml/docs/gguf.md; ggml/src/gguf.cpp `gguf_init_from_file`):
magic `GGUF`, version (2 or 3), tensor count and metadata count as uint64, then each
key/value (a string key, a gguf_type, the value), then per tensor its name, dimensions,
ggml type and offset into the data section. A tensor's bytes follow from its type's block
size (ggml/src/ggml.c `type_traits`).

Only the header is read, bounded by HEADER_LIMIT; numeric arrays of up to SMALL_ARRAY
values are kept (a per-layer head count), longer ones and arrays of strings (a vocabulary)
only by their length.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Mapping
from typing import BinaryIO

import attrs

MAGIC = b"GGUF"
HEADER_LIMIT = 64 << 20
"""The most header the gate reads (a vocabulary of 256k tokens is about 10 MiB)."""
SMALL_ARRAY = 4096
"""Numeric arrays up to this long are kept; longer ones are known by their length only."""

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

TYPE_NAMES = {
    "F32": 0, "F16": 1, "Q4_0": 2, "Q4_1": 3, "Q5_0": 6, "Q5_1": 7, "Q8_0": 8, "Q8_1": 9,
    "Q2_K": 10, "Q3_K": 11, "Q4_K": 12, "Q5_K": 13, "Q6_K": 14, "Q8_K": 15, "IQ2_XXS": 16,
    "IQ2_XS": 17, "IQ3_XXS": 18, "IQ1_S": 19, "IQ4_NL": 20, "IQ3_S": 21, "IQ2_S": 22,
    "IQ4_XS": 23, "I8": 24, "I16": 25, "I32": 26, "I64": 27, "F64": 28, "IQ1_M": 29,
    "BF16": 30, "TQ1_0": 34, "TQ2_0": 35, "MXFP4": 39,
}  # fmt: skip
"""A tensor type by the name Ollama's /api/show gives it (fs/ggml/type.go `String`)."""

# gguf_type: the scalar formats of a key's value (ggml/include/gguf.h).
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

Scalar = int | float | bool | str


class GgufError(ValueError):
    """The file is not a GGUF file the gate can read."""


@attrs.frozen
class LongArray:
    """An array the reader skipped (strings, or more than SMALL_ARRAY numbers)."""

    length: int


@attrs.frozen
class TensorInfo:
    """One entry of the tensor table."""

    name: str
    ggml_type: int
    dims: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        """Bytes the tensor takes as stored (its type's blocks; F16 for a type not known)."""
        return tensor_bytes(self.ggml_type, self.dims)

    @property
    def layer(self) -> int | None:
        """The repeating layer (`blk.N.`) it belongs to; None for the others."""
        if not self.name.startswith("blk."):
            return None
        index = self.name.split(".", 2)[1]
        return int(index) if index.isdigit() else None


MetaValue = Scalar | tuple[Scalar, ...] | LongArray


@attrs.frozen
class GgufHeader:
    """What a GGUF file's header says."""

    version: int
    metadata: Mapping[str, MetaValue]
    tensors: tuple[TensorInfo, ...]

    def get(self, key: str) -> MetaValue | None:
        return self.metadata.get(key)

    @property
    def architecture(self) -> str:
        value = self.metadata.get("general.architecture")
        return value if isinstance(value, str) else "llama"

    def arch_value(self, name: str) -> MetaValue | None:
        """`<architecture>.<name>` (`llama.block_count`)."""
        return self.metadata.get(f"{self.architecture}.{name}")

    @property
    def weights(self) -> int:
        """Bytes of every tensor as stored."""
        return sum(t.nbytes for t in self.tensors)


def tensor_bytes(kind: int, dims: tuple[int, ...]) -> int:
    """Bytes a tensor of ggml type `kind` and shape `dims` takes as stored."""
    block, size = TYPE_SIZES.get(kind, (1, 2))
    elements = 1
    for d in dims:
        elements *= d
    return elements // block * size


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

    def unpack(self, fmt: str) -> Scalar:
        value: Scalar = struct.unpack(fmt, self.take(struct.calcsize(fmt)))[0]
        return value

    def count(self) -> int:
        return int(self.unpack("<Q"))

    def string(self) -> str:
        return self.take(self.count()).decode("utf-8", "replace")

    def value(self, kind: int) -> MetaValue:
        if kind in _SCALARS:
            return self.unpack(_SCALARS[kind])
        if kind == _STRING:
            return self.string()
        if kind == _ARRAY:
            item, length = int(self.unpack("<I")), self.count()
            if item in _SCALARS:
                fmt = _SCALARS[item]
                raw = self.take(struct.calcsize(fmt) * length)
                if length > SMALL_ARRAY:
                    return LongArray(length)
                return tuple(struct.unpack("<" + fmt[1] * length, raw))
            if item == _STRING:
                for _ in range(length):
                    self.take(self.count())
                return LongArray(length)
            raise GgufError(f"array of metadata type {item} is not read")
        raise GgufError(f"unknown metadata type {kind}")


def read_header(stream: BinaryIO) -> GgufHeader:
    """The header of a GGUF stream; GgufError when it is not one."""
    reader = _Reader(stream)
    if reader.take(4) != MAGIC:
        raise GgufError("not a GGUF file (no GGUF magic)")
    version = int(reader.unpack("<I"))
    if version not in (2, 3):
        raise GgufError(f"GGUF version {version} is not read (2 or 3)")
    n_tensors, n_kv = reader.count(), reader.count()
    metadata: dict[str, MetaValue] = {}
    for _ in range(n_kv):
        key = reader.string()
        metadata[key] = reader.value(int(reader.unpack("<I")))
    tensors = []
    for _ in range(n_tensors):
        name = reader.string()
        dims = tuple(reader.count() for _ in range(int(reader.unpack("<I"))))
        kind = int(reader.unpack("<I"))
        reader.count()  # its offset into the data section
        tensors.append(TensorInfo(name, kind, dims))
    return GgufHeader(version, metadata, tuple(tensors))


def read_file(path: str | os.PathLike[str]) -> GgufHeader:
    """The header of the GGUF file at `path`; OSError or GgufError."""
    with open(path, "rb") as stream:
        return read_header(stream)


_CACHE: dict[tuple[str, int, int], GgufHeader] = {}


def cached_header(path: str) -> GgufHeader | None:
    """The header of the GGUF file at `path`, kept by its size and mtime; None when the
    gate cannot read it (no such file, no permission, not GGUF)."""
    try:
        stat = os.stat(path)
    except OSError:
        return None
    key = (path, stat.st_size, stat.st_mtime_ns)
    header = _CACHE.get(key)
    if header is None:
        try:
            header = read_file(path)
        except (OSError, GgufError):
            return None
        if len(_CACHE) > 256:
            _CACHE.clear()
        _CACHE[key] = header
    return header
