"""Ollama's keep_alive: parsed exactly as Ollama parses it, and capped by residency policy.

api.Duration.UnmarshalJSON (api/types.go) takes a JSON number (seconds, times 1e9 in
float64, converted to int64 nanoseconds; negative means forever) or a Go duration string
(time.ParseDuration; negative means forever); any other JSON type is a 400, and so is a
string ParseDuration refuses, including one beyond the largest int64 of nanoseconds.
The gate reads it the same way so that what it forwards means what it accounts.
"""

from __future__ import annotations

import math

import attrs

from gpugate.core.classes import ResidencyPolicy

FOREVER = math.inf
MAX_INT64 = 2**63 - 1
MIN_INT64 = -(2**63)
_NS = 1_000_000_000

_UNITS = {
    "ns": 1,
    "us": 1_000,
    "\u00b5s": 1_000,  # MICRO SIGN
    "\u03bcs": 1_000,  # GREEK SMALL LETTER MU
    "ms": 1_000_000,
    "s": _NS,
    "m": 60 * _NS,
    "h": 3600 * _NS,
}


class KeepAliveError(ValueError):
    """A keep_alive Ollama would refuse; the message is Ollama's own."""


@attrs.frozen
class KeepAlive:
    """A keep_alive: seconds (FOREVER for Go's largest duration), and for one read from a
    request the int64 nanoseconds Go holds, whose zero is the unload shortcut's test."""

    seconds: float
    nanos: int | None = None

    @property
    def forever(self) -> bool:
        return self.seconds == FOREVER

    @property
    def zero(self) -> bool:
        return self.nanos == 0 if self.nanos is not None else self.seconds == 0

    def to_json(self) -> int | float:
        """The value to put in a request body."""
        if self.forever:
            return -1
        return int(self.seconds) if self.seconds == int(self.seconds) else self.seconds


def _quote(text: str) -> str:
    return '"' + text + '"'


def _leading_int(s: str) -> tuple[int, str] | None:
    """time.leadingInt; None on overflow."""
    x = 0
    i = 0
    while i < len(s) and "0" <= s[i] <= "9":
        if x > (1 << 63) // 10:
            return None
        x = x * 10 + ord(s[i]) - 48
        if x > 1 << 63:
            return None
        i += 1
    return x, s[i:]


def _leading_fraction(s: str) -> tuple[int, float, str]:
    """time.leadingFraction: digits past an overflow are consumed and ignored."""
    x, scale, overflow, i = 0, 1.0, False, 0
    while i < len(s) and "0" <= s[i] <= "9":
        if not overflow:
            if x > MAX_INT64 // 10:
                overflow = True
            else:
                y = x * 10 + ord(s[i]) - 48
                if y > 1 << 63:
                    overflow = True
                else:
                    x, scale = y, scale * 10
        i += 1
    return x, scale, s[i:]


_PARSED: dict[str, int] = {}
"""Durations already parsed: a request's keep_alive is read twice (its type's check, then
its value), and clients send the same few ("5m", "10m", "-1")."""
_PARSED_MAX = 256
_PARSED_LONGEST = 32


def parse_go_duration(text: str) -> int:
    """Go's time.ParseDuration, in nanoseconds; KeepAliveError with Go's message."""
    nanos = _PARSED.get(text)
    if nanos is None:
        nanos = _parse_go_duration(text)
        if len(text) <= _PARSED_LONGEST and len(_PARSED) < _PARSED_MAX:
            _PARSED[text] = nanos
    return nanos


def _parse_go_duration(text: str) -> int:
    invalid = KeepAliveError("time: invalid duration " + _quote(text))
    s, neg = text, False
    if s and s[0] in "+-":
        neg, s = s[0] == "-", s[1:]
    if s == "0":
        return 0
    if not s:
        raise invalid
    total = 0
    while s:
        if not (s[0] == "." or "0" <= s[0] <= "9"):
            raise invalid
        before = len(s)
        leading = _leading_int(s)
        if leading is None:
            raise invalid
        whole, s = leading
        pre = before != len(s)
        post, frac, scale = False, 0, 1.0
        if s and s[0] == ".":
            s = s[1:]
            before = len(s)
            frac, scale, s = _leading_fraction(s)
            post = before != len(s)
        if not pre and not post:
            raise invalid
        i = 0
        while i < len(s) and not (s[i] == "." or "0" <= s[i] <= "9"):
            i += 1
        if i == 0:
            raise KeepAliveError("time: missing unit in duration " + _quote(text))
        name, s = s[:i], s[i:]
        unit = _UNITS.get(name)
        if unit is None:
            raise KeepAliveError(f"time: unknown unit {_quote(name)} in duration {_quote(text)}")
        if whole > (1 << 63) // unit:
            raise invalid
        whole *= unit
        if frac > 0:
            # float64, as Go computes it, so fractions round as Go's do
            whole += int(float(frac) * (float(unit) / scale))
            if whole > 1 << 63:
                raise invalid
        total += whole
        if total > 1 << 63:
            raise invalid
    if neg:
        return -total
    if total > MAX_INT64:
        raise invalid
    return total


def seconds_to_duration(seconds: float) -> int:
    """time.Duration(t * float64(time.Second)) as Go on amd64 converts it: a product
    beyond int64 (or infinite) becomes the smallest int64."""
    ns = seconds * 1e9
    if ns != ns or ns >= 2.0**63 or ns < -(2.0**63):
        return MIN_INT64
    return int(ns)


def parse_keep_alive(value: object) -> KeepAlive | None:
    """The keep_alive field as Ollama reads it; None when absent (or JSON null)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise KeepAliveError(_unsupported(value))
    if isinstance(value, str):
        nanos = parse_go_duration(value)
    elif value < 0:
        nanos = -1
    else:
        if isinstance(value, float) and not math.isfinite(value):
            raise KeepAliveError("cannot unmarshal number into Go value of type float64")
        nanos = seconds_to_duration(float(value))
        if nanos < 0:
            # Beyond int64 on the way in: Go's conversion is the CPU's (amd64 gives the
            # smallest int64, arm64 the largest), so it is taken as the longest ask.
            return KeepAlive(FOREVER, nanos)
    if nanos < 0:
        return KeepAlive(FOREVER, MAX_INT64)
    return KeepAlive(nanos / _NS, nanos)


def _unsupported(value: object) -> str:
    """Ollama's message, which names the Go type encoding/json decoded the value into."""
    go_type = {bool: "bool", list: "[]interface {}", tuple: "map[string]interface {}"}
    go_type[dict] = go_type[tuple]
    return f"Unsupported type: '{go_type.get(type(value), type(value).__name__)}'"


def policy_keep_alive(policy: ResidencyPolicy, ttl: float | None) -> KeepAlive:
    """The longest keep_alive a policy allows."""
    if policy is ResidencyPolicy.ALWAYS_WARM:
        return KeepAlive(FOREVER)
    if policy is ResidencyPolicy.LOAD_ON_DEMAND:
        return KeepAlive(0.0)
    return KeepAlive(300.0 if ttl is None else ttl)


def effective_keep_alive(requested: KeepAlive | None, allowed: KeepAlive) -> KeepAlive:
    """What the gate forwards: the client may ask for shorter, never for longer."""
    if requested is None or requested.seconds > allowed.seconds:
        return allowed
    return requested
