"""Small real images without an imaging library: solid-colour PNGs and a grey JPEG."""

from __future__ import annotations

import json
import struct
import zlib
from collections.abc import Mapping


def _chunk(kind: bytes, data: bytes) -> bytes:
    body = kind + data
    return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body) & 0xFFFFFFFF)


def solid_png(width: int, height: int, rgb: int, text: Mapping[str, object] | None = None) -> bytes:
    """A width×height PNG of one colour, with `text` as tEXt chunks (SaveImage's metadata)."""
    pixel = bytes(((rgb >> 16) & 0xFF, (rgb >> 8) & 0xFF, rgb & 0xFF))
    row = b"\x00" + pixel * width
    compressor = zlib.compressobj(6)
    data = b"".join(compressor.compress(row) for _ in range(height)) + compressor.flush()
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    chunks = [_chunk(b"IHDR", header)]
    for key, value in (text or {}).items():
        chunks.append(_chunk(b"tEXt", key.encode("latin-1") + b"\x00" + json.dumps(value).encode()))
    chunks += [_chunk(b"IDAT", data), _chunk(b"IEND", b"")]
    return b"\x89PNG\r\n\x1a\n" + b"".join(chunks)


def _segment(marker: int, payload: bytes) -> bytes:
    return struct.pack(">BBH", 0xFF, marker, len(payload) + 2) + payload


def grey_jpeg() -> bytes:
    """An 8×8 mid-grey baseline JPEG: one block whose DC and AC are both zero.

    Each Huffman table holds a single one-bit code (category 0 for DC, end-of-block for
    AC), so the scan is the two bits `00`, padded with ones.
    """
    quant = _segment(0xDB, b"\x00" + b"\x01" * 64)
    frame = _segment(0xC0, struct.pack(">BHHB", 8, 8, 8, 1) + b"\x01\x11\x00")
    one_code = b"\x01" + b"\x00" * 15 + b"\x00"
    tables = _segment(0xC4, b"\x00" + one_code) + _segment(0xC4, b"\x10" + one_code)
    scan = _segment(0xDA, b"\x01\x01\x00\x00\x3f\x00")
    return b"\xff\xd8" + quant + frame + tables + scan + b"\x3f" + b"\xff\xd9"
