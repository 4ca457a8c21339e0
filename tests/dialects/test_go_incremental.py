"""The Go dialect reads the same whether the bytes come at once or in pieces.

The differential corpus sends each case in one write, so the server mostly sees whole
heads and bodies; a listener sees them as the network cuts them. Here every case's head is
read from every prefix (a prefix answers None, or what the whole answers), and every
chunked body is fed in pieces cut anywhere (the same bytes, the same end, the same error).
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from gpugate.proxy.dialects.base import Chunks, Framing, RequestHead
from gpugate.proxy.dialects.go import DIALECT, READ_LIMIT, TOO_LARGE
from tests.dialects.corpus_go import cases

DATE = b"Mon, 07 Dec 2026 05:00:00 GMT"
SMALL = [c for c in cases() if len(c.data) < 20_000]
CHUNKED = []
for case in cases():
    head = DIALECT.read_head(case.data, DATE)
    if isinstance(head, RequestHead) and head.framing is Framing.CHUNKED:
        CHUNKED.append(case.data[head.size :])


def test_every_prefix_reads_as_none_or_as_the_whole() -> None:
    checked = 0
    for case in SMALL:
        whole = DIALECT.read_head(case.data, DATE)
        ends = range(len(case.data)) if len(case.data) < 2_000 else _sampled(len(case.data))
        for end in ends:
            part = DIALECT.read_head(case.data[:end], DATE)
            assert part is None or part == whole, (case.name, end)
            checked += 1
    assert checked > 50_000


def _sampled(size: int) -> list[int]:
    """Every 97th prefix of a long case, and each of its last 300."""
    return sorted({*range(0, size, 97), *range(max(size - 300, 0), size)})


def test_a_head_past_the_limit_is_refused_before_it_ends() -> None:
    data = b"GET / HTTP/1.1\r\nHost: x\r\nX-Pad: " + b"p" * READ_LIMIT
    assert DIALECT.read_head(data[: READ_LIMIT - 1], DATE) is None
    assert DIALECT.read_head(data, DATE) is TOO_LARGE


def _feed(body: bytes, cuts: list[int]) -> tuple[bytes, int, bool, str]:
    """Feed `body` cut at `cuts`, as a listener does: what a feed leaves unused is fed
    again with the next piece."""
    reader = DIALECT.chunks()
    out, used, start, unused = bytearray(), 0, 0, b""
    for cut in [*sorted(cuts), len(body)]:
        if start > cut:
            continue
        piece, start = unused + body[start:cut], cut
        chunks: Chunks = reader.feed(piece, DATE)
        unused = piece[chunks.used :]
        out += chunks.data
        used += chunks.used
        if chunks.done:
            return bytes(out), used, True, ""
        if chunks.error:  # the connection closes: where it stopped is nobody's business
            return bytes(out), -1, False, chunks.error
    return bytes(out), used, False, ""


def test_the_corpus_has_chunked_bodies() -> None:
    assert len(CHUNKED) >= 40


@settings(max_examples=400, deadline=None)
@given(st.sampled_from(CHUNKED), st.lists(st.integers(min_value=0, max_value=12_000), max_size=8))
def test_a_chunked_body_cut_anywhere_reads_the_same(body: bytes, cuts: list[int]) -> None:
    cuts = [c for c in cuts if c <= len(body)]
    assert _feed(body, cuts) == _feed(body, [])


@settings(max_examples=60, deadline=None)
@given(st.sampled_from([b for b in CHUNKED if len(b) < 600]))
def test_a_chunked_body_byte_by_byte_reads_the_same(body: bytes) -> None:
    assert _feed(body, list(range(len(body)))) == _feed(body, [])
