"""keep_alive parsing follows Ollama (Go's ParseDuration) and the policy cap is never exceeded."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpugate.core.classes import ResidencyPolicy
from gpugate.runtimes.ollama.keepalive import (
    FOREVER,
    KeepAlive,
    KeepAliveError,
    effective_keep_alive,
    parse_go_duration,
    parse_keep_alive,
    policy_keep_alive,
)


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        (300, 300.0),
        (0.5, 0.5),
        (0, 0.0),
        (-1, FOREVER),
        (-0.5, FOREVER),
        ("5m", 300.0),
        ("1h30m", 5400.0),
        ("300ms", 0.3),
        ("0s", 0.0),
        ("0", 0.0),
        ("1.5h", 5400.0),
        ("-1m", FOREVER),
        ("+2s", 2.0),
        ("2h45m30.5s", 9930.5),
        ("1us", 1e-6),
        ("1µs", 1e-6),
        ("10ns", 1e-8),
    ],
)
def test_accepted_forms(value, seconds):
    parsed = parse_keep_alive(value)
    assert parsed is not None
    assert parsed.seconds == pytest.approx(seconds) if math.isfinite(seconds) else parsed.forever


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("300", 'time: missing unit in duration "300"'),
        ("-1", 'time: missing unit in duration "-1"'),
        ("", 'time: invalid duration ""'),
        ("soon", 'time: invalid duration "soon"'),
        ("5x", 'time: unknown unit "x" in duration "5x"'),
        ("-", 'time: invalid duration "-"'),
        (True, "Unsupported type: 'bool'"),
        ([1], "Unsupported type: '[]interface {}'"),
        ({"a": 1}, "Unsupported type: 'map[string]interface {}'"),
    ],
)
def test_refused_forms_carry_ollamas_message(value, message):
    with pytest.raises(KeepAliveError) as caught:
        parse_keep_alive(value)
    assert str(caught.value) == message


def test_absent_and_null_are_none():
    assert parse_keep_alive(None) is None


def test_policy_ceilings():
    assert policy_keep_alive(ResidencyPolicy.ALWAYS_WARM, None).forever
    assert policy_keep_alive(ResidencyPolicy.LOAD_ON_DEMAND, 900.0).zero
    assert policy_keep_alive(ResidencyPolicy.KEEP_WARM, 900.0).seconds == 900.0
    assert policy_keep_alive(ResidencyPolicy.KEEP_WARM, None).seconds == 300.0


def test_json_form_ollama_reads_back_the_same():
    for seconds in (0.0, 1.0, 901.0, 0.25, FOREVER):
        again = parse_keep_alive(KeepAlive(seconds).to_json())
        assert again is not None and again.seconds == seconds


@given(
    requested=st.one_of(st.none(), st.floats(min_value=0, max_value=1e7), st.just(FOREVER)),
    ttl=st.floats(min_value=0, max_value=1e6),
)
def test_the_client_may_ask_for_shorter_never_longer(requested, ttl):
    allowed = KeepAlive(ttl)
    asked = None if requested is None else KeepAlive(requested)
    effective = effective_keep_alive(asked, allowed)
    assert effective.seconds <= allowed.seconds
    if asked is not None and asked.seconds <= ttl:
        assert effective == asked


def test_go_duration_sign_and_fractions():
    assert parse_go_duration("-1.5s") == -1_500_000_000
    assert parse_go_duration(".5s") == 500_000_000
