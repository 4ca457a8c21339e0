"""Sizes and durations as written: every value either reads or is a ValueError."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpugate.core.units import (
    MAX_DURATION,
    MAX_SIZE,
    GiB,
    parse_duration,
    parse_size,
)


@pytest.mark.parametrize(
    ("text", "nbytes"),
    [("7.5GiB", round(7.5 * GiB)), ("512MB", 512 * 10**6), ("1216348160", 1216348160),
     ("1TiB", 1024**4), ("1024TiB", MAX_SIZE), (4 * GiB, 4 * GiB), (2.0, 2)],
)  # fmt: skip
def test_sizes_read(text, nbytes):
    assert parse_size(text) == nbytes


@pytest.mark.parametrize(
    ("value", "words"),
    [
        ("9" * 400, "more bytes than any card has"),
        ("9" * 400 + "GiB", "more bytes than any card has"),
        ("1025TiB", "more bytes than any card has"),
        ("9" * 5000, "(5000 characters)"),
        (float("inf"), "whole number"),
        (float("nan"), "whole number"),
        (-1, "negative"),
        ("1.5XB", "unknown size unit"),
        (True, "boolean"),
    ],
)
def test_sizes_past_any_card_or_not_sizes_are_value_errors(value, words):
    with pytest.raises(ValueError) as caught:
        parse_size(value)
    assert words in str(caught.value)


@pytest.mark.parametrize(
    ("value", "words"),
    [
        ("9" * 400, "longer than 1000 years"),
        ("9" * 400 + "d", "longer than 1000 years"),
        ("99999999999999d", "longer than 1000 years"),
        (10**400, "longer than 1000 years"),
        (float("inf"), "longer than 1000 years"),
        (float("nan"), "NaN"),
        (-1, "negative"),
        (float("-inf"), "negative"),
        ("soon", "expected a duration"),
    ],
)
def test_durations_past_any_clock_or_not_durations_are_value_errors(value, words):
    with pytest.raises(ValueError) as caught:
        parse_duration(value)
    assert words in str(caught.value)


def test_the_longest_duration_reads():
    assert parse_duration(MAX_DURATION) == MAX_DURATION
    assert parse_duration("1h30m") == 5400.0


@given(st.text(max_size=60) | st.integers() | st.floats())
def test_any_value_is_a_size_or_a_value_error(value):
    try:
        nbytes = parse_size(value)
    except ValueError:
        return
    assert isinstance(nbytes, int) and nbytes >= 0


@given(st.text(max_size=60) | st.integers() | st.floats())
def test_any_value_is_a_finite_duration_or_a_value_error(value):
    try:
        seconds = parse_duration(value)
    except ValueError:
        return
    assert 0 <= seconds <= MAX_DURATION
