"""A small GGUF header reader: what a simulated llama-server needs to know of a model file.

No numpy, no `gguf` package: the simulator ships with the product. The header is read as
ggml's `gguf_init_from_file` reads it (ggml/src/gguf.cpp): magic `GGUF`, version (2 or 3),
tensor count, key/value count, the key/value pairs, then one info record per tensor (name,
dimensions, type, offset into the data section). The data section starts at the next
multiple of `general.alignment` (32 by default).

A tensor's byte size is taken from the offsets (the next tensor's offset, or the data
section's end for the last one), so no table of quantisation block sizes is needed; it
includes the alignment padding, as ggml's buffers do.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Mapping
from typing import Any, BinaryIO

import attrs

GGUF_MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32
MAX_ARRAY = 1 << 24
"""Refuse arrays longer than this (a corrupt header must not make us allocate gigabytes)."""

# gguf_type: the scalar formats of a key's value (ggml/include/gguf.h).
_SCALARS = {
    0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i",
    6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d",
}  # fmt: skip
_STRING = 8
_ARRAY = 9


class NotGguf(Exception):
    """The file is not a GGUF model llama.cpp could read (bad magic, version, truncated)."""


@attrs.frozen
class Tensor:
    name: str
    type: int
    dims: tuple[int, ...]
    offset: int
    nbytes: int

    @property
    def layer(self) -> int | None:
        """The repeating layer (`blk.N.`) this tensor belongs to, None for the others."""
        if not self.name.startswith("blk."):
            return None
        index = self.name.split(".", 2)[1]
        return int(index) if index.isdigit() else None


@attrs.frozen
class GgufFile:
    """The header of one GGUF file."""

    path: str
    version: int
    metadata: Mapping[str, Any]
    tensors: tuple[Tensor, ...]
    file_size: int

    def get(self, key: str, default: Any = None) -> Any:
        return self.metadata.get(key, default)

    @property
    def tensor_bytes(self) -> int:
        return sum(t.nbytes for t in self.tensors)


class _Reader:
    def __init__(self, stream: BinaryIO) -> None:
        self.stream = stream

    def take(self, size: int) -> bytes:
        data = self.stream.read(size)
        if len(data) != size:
            raise NotGguf("truncated header")
        return data

    def scalar(self, fmt: str) -> Any:
        return struct.unpack(fmt, self.take(struct.calcsize(fmt)))[0]

    def string(self) -> str:
        size = self.scalar("<Q")
        if size > MAX_ARRAY:
            raise NotGguf("string too long")
        return self.take(size).decode("utf-8", errors="replace")

    def value(self, kind: int) -> Any:
        if kind in _SCALARS:
            return self.scalar(_SCALARS[kind])
        if kind == _STRING:
            return self.string()
        if kind == _ARRAY:
            item = self.scalar("<I")
            count = self.scalar("<Q")
            if count > MAX_ARRAY or item == _ARRAY:
                raise NotGguf("array too long or nested")
            if item in _SCALARS:
                fmt = _SCALARS[item]
                size = struct.calcsize(fmt)
                raw = self.take(size * count)
                return list(struct.unpack("<" + fmt[1] * count, raw))
            return [self.value(item) for _ in range(count)]
        raise NotGguf(f"unknown value type {kind}")


def read_gguf(path: str | os.PathLike[str]) -> GgufFile:
    """The header of the GGUF file at `path`; NotGguf when it is not one, OSError when it
    does not open."""
    with open(path, "rb") as stream:
        size = os.fstat(stream.fileno()).st_size
        reader = _Reader(stream)
        if reader.take(4) != GGUF_MAGIC:
            raise NotGguf("bad magic")
        version = reader.scalar("<I")
        if version not in (2, 3):
            raise NotGguf(f"unsupported version {version}")
        n_tensors = reader.scalar("<Q")
        n_kv = reader.scalar("<Q")
        if n_tensors > MAX_ARRAY or n_kv > MAX_ARRAY:
            raise NotGguf("too many tensors or keys")
        metadata: dict[str, Any] = {}
        for _ in range(n_kv):
            key = reader.string()
            metadata[key] = reader.value(reader.scalar("<I"))
        infos = []
        for _ in range(n_tensors):
            name = reader.string()
            n_dims = reader.scalar("<I")
            dims = tuple(reader.scalar("<Q") for _ in range(n_dims))
            infos.append((name, reader.scalar("<I"), dims, reader.scalar("<Q")))
        alignment = int(metadata.get("general.alignment", DEFAULT_ALIGNMENT)) or 1
        start = stream.tell()
        data_offset = (start + alignment - 1) // alignment * alignment
    data_size = max(0, size - data_offset)
    ends = sorted({offset for *_, offset in infos} | {data_size})
    tensors = []
    for name, kind, dims, offset in infos:
        following = next((end for end in ends if end > offset), data_size)
        tensors.append(Tensor(name, kind, dims, offset, max(0, following - offset)))
    return GgufFile(str(path), version, metadata, tuple(tensors), size)
