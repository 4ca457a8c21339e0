"""Byte sizes and durations as people write them in config files and read them in messages."""

from __future__ import annotations

import math
import re

KiB = 1024
MiB = 1024**2
GiB = 1024**3
TiB = 1024**4

_SIZE_UNITS = {
    "": 1,
    "b": 1,
    "k": 1000,
    "kb": 1000,
    "m": 1000**2,
    "mb": 1000**2,
    "g": 1000**3,
    "gb": 1000**3,
    "t": 1000**4,
    "tb": 1000**4,
    "ki": KiB,
    "kib": KiB,
    "mi": MiB,
    "mib": MiB,
    "gi": GiB,
    "gib": GiB,
    "ti": TiB,
    "tib": TiB,
}
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?|\.\d+)\s*([a-zA-Z]*)\s*$")

_DURATION_UNITS = {
    "ms": 0.001,
    "s": 1.0,
    "m": 60.0,
    "h": 3600.0,
    "d": 86400.0,
}
_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?|\.\d+)(ms|s|m|h|d)")

MAX_SIZE = 1024**5
"""The most a size may say (1 PiB): no card comes near, and every size below it is exact
enough as a double, so nothing past it needs reading."""
MAX_DURATION = 1000 * 365 * 86400.0
"""The longest a duration may be (1,000 years): longer is no setting anyone means, and the
bound keeps every duration finite wherever it is added to a clock."""
_SHOWN = 40


def _shown(value: str) -> str:
    """`value` as a message quotes it: its start only, when it is long."""
    if len(value) <= _SHOWN:
        return repr(value)
    return f"{value[:_SHOWN]!r}... ({len(value)} characters)"


def parse_size(value: object) -> int:
    """Parse "7.5GiB", "1216348160", "512MB" or an int into bytes; ValueError otherwise.

    Binary suffixes (KiB, MiB, GiB) are powers of 1024; decimal ones (KB, MB, GB) of 1000,
    as on a disk label. A bare number is bytes.
    """
    if isinstance(value, bool):
        raise ValueError("expected a size like '7.5GiB', got a boolean")
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"a size cannot be negative, got {value}")
        return value
    if isinstance(value, float):
        if value < 0 or not math.isfinite(value) or value != int(value):
            raise ValueError(f"a size in bytes must be a whole number, got {value!r}")
        return int(value)
    if not isinstance(value, str):
        raise ValueError(f"expected a size like '7.5GiB', got {value!r}")
    match = _SIZE_RE.match(value)
    if match is None:
        raise ValueError(f"expected a size like '7.5GiB', got {_shown(value)}")
    number, unit = match.groups()
    factor = _SIZE_UNITS.get(unit.lower())
    if factor is None:
        raise ValueError(
            f"unknown size unit {unit!r} in {_shown(value)} (use B, KiB, MiB, GiB, MB, GB)"
        )
    nbytes = float(number) * factor
    # A string of digits past a double's range reads as infinity, which no round() takes.
    if not nbytes <= MAX_SIZE:
        raise ValueError(f"{_shown(value)} is more bytes than any card has (at most 1 PiB)")
    return round(nbytes)


def parse_duration(value: object) -> float:
    """Parse "15m", "901s", "1h30m", "250ms" or a number of seconds into seconds."""
    if isinstance(value, bool):
        raise ValueError("expected a duration like '15m', got a boolean")
    if isinstance(value, int | float):
        if isinstance(value, float) and math.isnan(value):
            raise ValueError("a duration must be a number of seconds, got NaN")
        if value < 0:
            raise ValueError(f"a duration cannot be negative, got {value}")
        # A JSON integer may have thousands of digits: compared, never made a float.
        if value > MAX_DURATION:
            raise ValueError("a duration longer than 1000 years is no duration")
        return float(value)
    if not isinstance(value, str):
        raise ValueError(f"expected a duration like '15m', got {value!r}")
    text = value.strip()
    if re.fullmatch(r"\d+(?:\.\d+)?", text):
        total = float(text)
    else:
        pos = 0
        total = 0.0
        for part in _DURATION_PART.finditer(text):
            if part.start() != pos:
                break
            total += float(part.group(1)) * _DURATION_UNITS[part.group(2)]
            pos = part.end()
        if pos == 0 or pos != len(text):
            raise ValueError(f"expected a duration like '15m', got {_shown(value)}")
    # Digits past a double's range read as infinity.
    if not total <= MAX_DURATION:
        raise ValueError(f"{_shown(value)}: a duration longer than 1000 years is no duration")
    return total


def format_gib(nbytes: int | float) -> str:
    """Bytes as GiB with one decimal: 9000000000 -> '8.4 GiB'."""
    return f"{nbytes / GiB:.1f} GiB"


def format_duration(seconds: float) -> str:
    """Seconds as a short duration: 901 -> '15m1s', 0.25 -> '250ms'."""
    if seconds < 1:
        return f"{round(seconds * 1000)}ms"
    whole = round(seconds)
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    out = ""
    if hours:
        out += f"{hours}h"
    if minutes:
        out += f"{minutes}m"
    if secs or not out:
        out += f"{secs}s"
    return out
