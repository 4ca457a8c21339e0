"""The Go dialect's memos of request lines and field lines (go.py `_REQUEST_LINES`,
go_text.py `_PLAIN_LINES`) change no reading: every corpus case, and every mutation of
the corpus, reads the same with the memos empty, warm from every other case, and full to
their bound and started again."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from gpugate.proxy.dialects import go, go_text
from gpugate.proxy.dialects.go import DIALECT
from tests.dialects.corpus_go import cases

DATE = b"Mon, 07 Dec 2026 05:00:00 GMT"
CASES = [case.data for case in cases()]


def cold(data: bytes) -> object:
    go._REQUEST_LINES.clear()
    go_text._PLAIN_LINES.clear()
    return DIALECT.read_head(data, DATE)


def test_every_case_reads_the_same_cold_and_warm() -> None:
    first = [cold(data) for data in CASES]
    for data in CASES:  # every line of the corpus is in the memos now (within their bound)
        DIALECT.read_head(data, DATE)
    assert go._REQUEST_LINES and go_text._PLAIN_LINES
    warm = [DIALECT.read_head(data, DATE) for data in CASES]
    assert warm == first
    assert [DIALECT.read_head(data, DATE) for data in reversed(CASES)] == first[::-1]


def test_the_memos_stay_within_their_bound() -> None:
    go_text._PLAIN_LINES.clear()
    head = b"GET / HTTP/1.1\r\nHost: h\r\n"
    for i in range(go_text._PLAIN_LINES_MOST + 10):
        read = DIALECT.read_head(head + b"X-N: %d\r\n\r\n" % i, DATE)
        assert read.headers[-1] == ("X-N", str(i))  # type: ignore[union-attr]
    assert len(go_text._PLAIN_LINES) <= go_text._PLAIN_LINES_MOST
    for i in range(go._REQUEST_LINES_MOST + 10):
        read = DIALECT.read_head(b"GET /%d HTTP/1.1\r\nHost: h\r\n\r\n" % i, DATE)
        assert read.target == f"/{i}"  # type: ignore[union-attr]
    assert len(go._REQUEST_LINES) <= go._REQUEST_LINES_MOST
    long = b"Cookie: " + b"a" * go_text._PLAIN_LINE_LONGEST + b"\r\n"
    DIALECT.read_head(head + long + b"\r\n", DATE)
    assert long[:-2] not in go_text._PLAIN_LINES


@settings(max_examples=300, deadline=None)
@given(
    st.sampled_from(CASES),
    st.sampled_from(CASES),
    st.integers(min_value=0, max_value=400),
    st.binary(min_size=1, max_size=3),
)
def test_a_mutated_case_reads_the_same_after_any_other(before, data, at, insert) -> None:
    mutated = data[:at] + insert + data[at:]
    expected = cold(mutated)
    DIALECT.read_head(before, DATE)
    DIALECT.read_head(mutated, DATE)
    assert DIALECT.read_head(mutated, DATE) == expected
