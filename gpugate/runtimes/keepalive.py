"""Ollama's keep_alive: parsed exactly as Ollama parses it, and capped by residency policy.

Ollama accepts a JSON number (seconds; negative means forever) or a Go duration string
("5m", "1h30m", "300ms", "-1m"); a string without a unit, or any other JSON type, is a
400. The gate reads it the same way so that what it forwards means what it accounts.
"""

from __future__ import annotations

import math
import re

import attrs

from gpugate.core.classes import ResidencyPolicy

FOREVER = math.inf

_GO_UNITS = {
    "ns": 1e-9,
    "us": 1e-6,
    "µs": 1e-6,
    "μs": 1e-6,
    "ms": 1e-3,
    "s": 1.0,
    "m": 60.0,
    "h": 3600.0,
}
_GO_PART = re.compile(r"(\d+\.?\d*|\.\d+)(ns|us|µs|μs|ms|s|m|h)")


class KeepAliveError(ValueError):
    """A keep_alive Ollama would refuse; the message is Ollama's own."""


@attrs.frozen
class KeepAlive:
    """A parsed keep_alive: seconds, or FOREVER."""

    seconds: float

    @property
    def forever(self) -> bool:
        return self.seconds == FOREVER

    @property
    def zero(self) -> bool:
        return self.seconds == 0

    def to_json(self) -> int | float:
        """The value to put in a request body."""
        if self.forever:
            return -1
        return int(self.seconds) if self.seconds == int(self.seconds) else self.seconds


def parse_go_duration(text: str) -> float:
    """Go's time.ParseDuration, in seconds; raises KeepAliveError with Go's message."""
    original = text
    quoted = '"' + original + '"'
    if text in ("0", "+0", "-0"):
        return 0.0
    if not text:
        raise KeepAliveError(f"time: invalid duration {quoted}")
    sign = 1.0
    if text[0] in "+-":
        sign = -1.0 if text[0] == "-" else 1.0
        text = text[1:]
    if not text:
        raise KeepAliveError(f"time: invalid duration {quoted}")
    total = 0.0
    pos = 0
    while pos < len(text):
        match = _GO_PART.match(text, pos)
        if match is None:
            number = re.match(r"\d+\.?\d*|\.\d+", text[pos:])
            if number is not None and pos + number.end() == len(text):
                raise KeepAliveError(f"time: missing unit in duration {quoted}")
            if number is not None:
                unit = re.match(r"[^\d.]+", text[pos + number.end() :])
                raise KeepAliveError(
                    f'time: unknown unit "{unit.group(0) if unit else ""}" in duration {quoted}'
                )
            raise KeepAliveError(f"time: invalid duration {quoted}")
        total += float(match.group(1)) * _GO_UNITS[match.group(2)]
        pos = match.end()
    return sign * total


def parse_keep_alive(value: object) -> KeepAlive | None:
    """The keep_alive field as Ollama reads it; None when absent (or JSON null)."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise KeepAliveError(_unsupported(value))
    if isinstance(value, int | float):
        seconds = float(value)
    elif isinstance(value, str):
        seconds = parse_go_duration(value)
    else:
        raise KeepAliveError(_unsupported(value))
    return KeepAlive(FOREVER if seconds < 0 else seconds)


def _unsupported(value: object) -> str:
    """Ollama's message, which names the Go type encoding/json decoded the value into."""
    go_type = {bool: "bool", list: "[]interface {}", dict: "map[string]interface {}"}
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
