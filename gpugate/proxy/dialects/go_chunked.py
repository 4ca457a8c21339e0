"""Go's chunked request bodies: internal/chunked.go `chunkedReader`, then transfer.go
`(*body).readTrailer`, decoded incrementally; a malformed body is the handler's error."""

from __future__ import annotations

import enum

from gpugate.proxy.dialects.base import Chunks
from gpugate.proxy.dialects.go_text import (
    Incomplete,
    Lines,
    Malformed,
    read_fields,
)

MAX_CHUNK_LINE = 4096
"""internal/chunked.go `maxLineLength` (and bufio's buffer, which a chunk line must fit)."""
MAX_TRAILER_PEEK = 4096
"""transfer.go `seeUpcomingDoubleCRLF` peeks no further than bufio's buffer."""
_HEX = frozenset(b"0123456789abcdefABCDEF")


class _ChunkState(enum.Enum):
    SIZE = "size"
    DATA = "data"
    END = "end"
    TRAILER = "trailer"
    DONE = "done"
    FAILED = "failed"


class GoChunkReader:
    """internal/chunked.go `chunkedReader` then transfer.go `(*body).readTrailer`.

    A partial chunk line is kept (and counted as used); an unfinished trailer is not: it
    may end before bytes of the next request (a trailer of LF-only lines is found by a
    CRLF CRLF further on), so its bytes are left unused, to be fed again with what follows.
    """

    def __init__(self) -> None:
        self._state = _ChunkState.SIZE
        self._pending = b""
        self._left = 0
        self._excess = 0

    def eof_error(self, unused: bytes = b"") -> str:
        """The error the handler reads if the stream ends now, `unused` the bytes fed and
        not used (transfer.go `readTrailer`: fewer than two trailer bytes, or no blank line,
        is its own message)."""
        if self._state is _ChunkState.TRAILER:
            if len(unused) < 2:
                return "http: unexpected EOF reading trailer"
            return "http: suspiciously long trailer after chunked body"
        return "unexpected EOF"

    def feed(self, data: bytes, date: bytes) -> Chunks:
        """Decode `data`; a partial chunk line or trailer is kept (and counted as used)."""
        del date  # Go's server writes nothing of its own for a malformed body
        buf, start = self._pending + data, len(self._pending)
        pos, out = 0, bytearray()
        while self._state not in (_ChunkState.DONE, _ChunkState.FAILED):
            if self._state is _ChunkState.DATA:
                take = min(self._left, len(buf) - pos)
                out += buf[pos : pos + take]
                pos += take
                self._left -= take
                if self._left:
                    break
                self._state = _ChunkState.END
            elif self._state is _ChunkState.END:
                if len(buf) - pos < 2:
                    break
                pos += 2
                if buf[pos - 2 : pos] != b"\r\n":
                    return self._fail(out, len(data), "malformed chunked encoding")
                self._state = _ChunkState.SIZE
            elif self._state is _ChunkState.SIZE:
                end = buf.find(b"\n", pos)
                if end < 0 or end - pos >= MAX_CHUNK_LINE:
                    if len(buf) - pos >= MAX_CHUNK_LINE:
                        return self._fail(out, len(data), "header line too long")
                    break
                error = self._size_line(buf[pos : end + 1])
                pos = end + 1
                if error:
                    return self._fail(out, len(data), error)
            else:
                pos, error = self._trailer(buf, pos)
                if error:
                    return self._fail(out, len(data), error)
                if self._state is _ChunkState.TRAILER:
                    break
        if self._state in (_ChunkState.DONE, _ChunkState.TRAILER):
            self._pending, used = b"", pos - start
        else:
            self._pending, used = buf[pos:], len(data)
        return Chunks(bytes(out), used, self._state is _ChunkState.DONE)

    def _fail(self, out: bytearray, fed: int, error: str) -> Chunks:
        # net/http closes the connection after any chunked error (transfer.go body.Close
        # sees no EOF: an early close), so what follows is nobody's: all of it is used
        self._state, self._pending = _ChunkState.FAILED, b""
        return Chunks(bytes(out), fed, False, error=error)

    def _size_line(self, line: bytes) -> str:
        """internal/chunked.go `beginChunk`: "" or the error it sets."""
        cr = line.find(b"\r")
        if cr < 0:
            return "chunked line ends with bare LF"
        if cr != len(line) - 2:
            return "invalid CR in chunked line"
        line = line[:-2]
        self._excess += len(line) + 2
        size = line.rstrip(b" \t").partition(b";")[0]
        if not size:
            return "empty hex number for chunk length"
        for i, c in enumerate(size[:17]):  # parseHexUint: each byte, then the 17th
            if c not in _HEX:
                return "invalid byte in chunk length"
            if i == 16:
                return "http chunk length too large"
        self._left = int(size, 16)
        self._excess = max(self._excess - 16 - 2 * self._left, 0)
        if self._excess > 16 * 1024:
            return "chunked encoding contains too much non-data"
        self._state = _ChunkState.DATA if self._left else _ChunkState.TRAILER
        return ""

    def _trailer(self, buf: bytes, pos: int) -> tuple[int, str]:
        """transfer.go `(*body).readTrailer`."""
        if len(buf) - pos < 2:
            return pos, ""
        if buf[pos : pos + 2] == b"\r\n":
            self._state = _ChunkState.DONE
            return pos + 2, ""
        if buf.find(b"\r\n\r\n", pos, pos + MAX_TRAILER_PEEK) < 0:
            if len(buf) - pos >= MAX_TRAILER_PEEK:
                return pos, "http: suspiciously long trailer after chunked body"
            return pos, ""
        lines = Lines(buf, pos)
        try:
            read_fields(lines)
        except Incomplete:
            return pos, ""
        except Malformed as malformed:
            return lines.pos, str(malformed)
        self._state = _ChunkState.DONE
        return lines.pos, ""
