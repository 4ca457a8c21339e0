"""The exchange harness's normalising: what differs between two servers' answers only by
the moment they were made compares equal, and nothing else does."""

from __future__ import annotations

from tests.dialects.harness import complete_answers, normalise


def answer(date: bytes, body: bytes) -> bytes:
    head = b"HTTP/1.1 200 OK\r\nDate: " + date + b"\r\nContent-Length: %d\r\n\r\n" % len(body)
    return head + body


def test_a_created_stamp_a_second_apart_compares_equal_and_keeps_its_length() -> None:
    earlier = answer(b"Mon, 07 Dec 2026 20:07:26 GMT", b'{"created":1796674064,"id":"m"}')
    later = answer(b"Mon, 07 Dec 2026 20:07:27 GMT", b'{"created":1796674065,"id":"m"}')
    assert normalise(earlier) == normalise(later)
    assert len(normalise(earlier)) == len(earlier)
    assert complete_answers(normalise(earlier)) == (1, len(earlier))


def test_a_body_that_differs_elsewhere_still_differs() -> None:
    one = answer(b"Mon, 07 Dec 2026 20:07:26 GMT", b'{"created":1796674064,"id":"m"}')
    other = answer(b"Mon, 07 Dec 2026 20:07:26 GMT", b'{"created":1796674064,"id":"n"}')
    assert normalise(one) != normalise(other)
