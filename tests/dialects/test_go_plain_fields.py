"""The Go dialect's quick reading of a plain head gives the fields its line-by-line
reading gives, on every corpus case, its mutations and generated heads; and it declines
rather than answer differently (every refusal is the line-by-line reader's)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from gpugate.proxy.dialects import go_text
from gpugate.proxy.dialects.go_text import Incomplete, Lines, Malformed
from tests.dialects.corpus_go import cases, mutations


def _line_by_line(lines: Lines) -> list[tuple[str, str]]:
    plain = go_text._plain_fields
    go_text._plain_fields = lambda lines: None  # type: ignore[assignment]
    try:
        return go_text.read_fields(lines)
    finally:
        go_text._plain_fields = plain  # type: ignore[assignment]


def _same(data: bytes) -> bool:
    """Whether the quick reading took `data`'s head; asserts it read it as the slow one."""
    start = data.find(b"\n")
    if start < 0:
        return False
    quick, slow = Lines(data, start + 1), Lines(data, start + 1)
    fields = go_text._plain_fields(quick)
    if fields is None:
        return False
    try:
        expected = _line_by_line(slow)
    except (Incomplete, Malformed) as exc:
        raise AssertionError(f"the quick reading took a head the slow one refuses: {exc}") from exc
    assert (fields, quick.pos) == (expected, slow.pos)
    return True


def test_every_corpus_case_and_mutation_reads_alike() -> None:
    every = [c.data for c in cases()] + [c.data for c in mutations(20261210, 2_000)]
    taken = sum(_same(data) for data in every)
    # It must be the common path, not a path never taken.
    assert taken > len(every) // 4, (taken, len(every))


NAMES = st.sampled_from(
    [b"Host", b"host", b"content-LENGTH", b"X-Gpugate-Priority", b"a b", b"", b"T\xe9", b"K"]
)
VALUES = st.binary(max_size=12) | st.sampled_from([b" v ", b"\tx", b"a\rb", b"c\nd", b""])
SEPARATORS = st.sampled_from([b"\r\n", b"\n", b"\r\n ", b"\r\n\t", b"\r\r\n"])


@settings(max_examples=600, deadline=None)
@given(st.lists(st.tuples(NAMES, VALUES, SEPARATORS), max_size=6), st.booleans())
def test_generated_heads_read_alike(
    fields: list[tuple[bytes, bytes, bytes]], colon_missing: bool
) -> None:
    head = b"GET / HTTP/1.1\r\n"
    for name, value, separator in fields:
        head += name + (b"" if colon_missing and name == b"K" else b":") + value + separator
    _same(head + b"\r\n")
