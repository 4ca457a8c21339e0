"""Properties of the reading: keep_alive numbers and names against reference models."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from gpugate.runtimes.ollama.keepalive import MAX_INT64, parse_go_duration, parse_keep_alive
from gpugate.runtimes.ollama.names import canonical_name, model_ref


@given(st.integers(min_value=0, max_value=3_000_000), st.sampled_from(["h", "m", "s", "ms"]))
def test_durations_overflow_exactly_where_int64_nanoseconds_do(count, unit):
    scale = {"h": 3600 * 10**9, "m": 60 * 10**9, "s": 10**9, "ms": 10**6}[unit]
    try:
        nanos = parse_go_duration(f"{count}{unit}")
    except ValueError:
        assert count * scale > MAX_INT64
    else:
        assert nanos == count * scale <= MAX_INT64


@given(
    st.sampled_from([" ", "\t", "\n", "\r", "\x85", "\xa0", "\u3000"]), st.text("abc", min_size=1)
)
def test_names_are_trimmed_as_go_trims(space, name):
    ref = model_ref(space + name + space)
    assert ref is not None and ref.name == canonical_name(name)


def test_a_separator_that_python_strips_is_not_trimmed():
    assert model_ref("\x1cm") is None


@given(st.floats(min_value=0, max_value=1e6))
def test_number_keep_alive_is_nanoseconds(seconds):
    parsed = parse_keep_alive(seconds)
    assert parsed.zero == (int(seconds * 1e9) == 0)
