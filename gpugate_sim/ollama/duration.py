"""Go's time.Duration as Ollama reads and writes it: ParseDuration, String, keep_alive.

Durations are integer nanoseconds, as in Go. "Forever" is Go's math.MaxInt64, which is
what Ollama stores for a negative keep_alive; error texts are Go's, byte for byte, because
clients (and a gate in front of Ollama) see them in 400 responses.
"""

from __future__ import annotations

NANOSECOND = 1
MICROSECOND = 1000 * NANOSECOND
MILLISECOND = 1000 * MICROSECOND
SECOND = 1000 * MILLISECOND
MINUTE = 60 * SECOND
HOUR = 60 * MINUTE

MAX_INT64 = (1 << 63) - 1
MIN_INT64 = -(1 << 63)
FOREVER = MAX_INT64
"""What Ollama stores for a negative keep_alive: about 292 years."""

DEFAULT_KEEP_ALIVE = 5 * MINUTE

_UNITS = {
    "ns": NANOSECOND,
    "us": MICROSECOND,
    "\u00b5s": MICROSECOND,  # micro sign
    "\u03bcs": MICROSECOND,  # Greek mu
    "ms": MILLISECOND,
    "s": SECOND,
    "m": MINUTE,
    "h": HOUR,
}


class DurationError(ValueError):
    """A duration Go would refuse; the message is Go's."""


def go_quote(text: str) -> str:
    """Go's time.quote: double quotes, with non-ASCII and control bytes as \\x escapes."""
    out = ['"']
    for char in text:
        if ord(char) >= 0x80 or char < " ":
            out.extend(f"\\x{byte:02x}" for byte in char.encode("utf-8", "surrogatepass"))
        else:
            if char in '"\\':
                out.append("\\")
            out.append(char)
    out.append('"')
    return "".join(out)


def _leading_int(s: str) -> tuple[int, str]:
    x = 0
    i = 0
    while i < len(s) and "0" <= s[i] <= "9":
        if x > (1 << 63) // 10:
            raise OverflowError
        x = x * 10 + ord(s[i]) - ord("0")
        if x > 1 << 63:
            raise OverflowError
        i += 1
    return x, s[i:]


def _leading_fraction(s: str) -> tuple[int, float, str]:
    x = 0
    scale = 1.0
    overflow = False
    i = 0
    while i < len(s) and "0" <= s[i] <= "9":
        if not overflow:
            if x > MAX_INT64 // 10:
                overflow = True
            else:
                y = x * 10 + ord(s[i]) - ord("0")
                if y > 1 << 63:
                    overflow = True
                else:
                    x = y
                    scale *= 10
        i += 1
    return x, scale, s[i:]


def parse_go_duration(text: str) -> int:
    """time.ParseDuration: "300ms", "-1.5h", "1h30m" -> nanoseconds; DurationError otherwise."""
    orig = text
    s = text
    neg = False
    invalid = DurationError("time: invalid duration " + go_quote(orig))
    if s and s[0] in "+-":
        neg = s[0] == "-"
        s = s[1:]
    if s == "0":
        return 0
    if not s:
        raise invalid
    total = 0
    while s:
        if not (s[0] == "." or "0" <= s[0] <= "9"):
            raise invalid
        before = len(s)
        try:
            whole, s = _leading_int(s)
        except OverflowError:
            raise invalid from None
        pre = before != len(s)
        post = False
        frac, scale = 0, 1.0
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
            raise DurationError("time: missing unit in duration " + go_quote(orig))
        unit_text, s = s[:i], s[i:]
        unit = _UNITS.get(unit_text)
        if unit is None:
            raise DurationError(
                "time: unknown unit " + go_quote(unit_text) + " in duration " + go_quote(orig)
            )
        if whole > (1 << 63) // unit:
            raise invalid
        whole *= unit
        if frac > 0:
            # Go does this part in float64 too, so fractions round the way Go's do.
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


def _fmt_frac(value: int, prec: int) -> tuple[str, int]:
    digits = ""
    printed = False
    for _ in range(prec):
        digit = value % 10
        printed = printed or digit != 0
        if printed:
            digits = str(digit) + digits
        value //= 10
    return ("." + digits if printed else ""), value


def format_go_duration(ns: int) -> str:
    """time.Duration.String: 90 * SECOND -> "1m30s", 1500 * MICROSECOND -> "1.5ms"."""
    u = -ns if ns < 0 else ns
    if u < SECOND:
        if u == 0:
            return "0s"
        if u < MICROSECOND:
            text = f"{u}ns"
        elif u < MILLISECOND:
            frac, u = _fmt_frac(u, 3)
            text = f"{u}{frac}\u00b5s"
        else:
            frac, u = _fmt_frac(u, 6)
            text = f"{u}{frac}ms"
    else:
        frac, u = _fmt_frac(u, 9)
        text = f"{u % 60}{frac}s"
        u //= 60
        if u > 0:
            text = f"{u % 60}m" + text
            u //= 60
            if u > 0:
                text = f"{u}h" + text
    return "-" + text if ns < 0 else text


def _go_type_name(value: object) -> str:
    if isinstance(value, list):
        return "[]interface {}"
    if isinstance(value, dict):
        return "map[string]interface {}"
    if isinstance(value, bool):
        return "bool"
    return type(value).__name__


def _float_to_duration(seconds: float) -> int:
    ns = seconds * 1e9
    # Go converts an out-of-range float64 to int64 as the amd64 instruction does.
    if ns != ns or ns >= 2.0**63 or ns < -(2.0**63):
        return MIN_INT64
    return int(ns)


def decode_keep_alive(value: object) -> int:
    """api.Duration.UnmarshalJSON for a JSON keep_alive that is present and not null.

    A number is seconds (fractions allowed), a string is a Go duration; negative means
    forever. Anything else is "Unsupported type", as Ollama answers it.
    """
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise DurationError(f"Unsupported type: '{_go_type_name(value)}'")
    if isinstance(value, str):
        ns = parse_go_duration(value)
        return FOREVER if ns < 0 else ns
    if value < 0:
        return FOREVER
    return _float_to_duration(float(value))


def parse_keep_alive_setting(value: object) -> int:
    """OLLAMA_KEEP_ALIVE as the server reads it: a Go duration or a number of seconds.

    Negative means forever. Where Ollama silently falls back to 5m on a bad value, this
    raises DurationError so a scenario file with a typo is reported, not ignored.
    """
    if isinstance(value, bool):
        raise DurationError(f"expected a duration like '5m' or seconds, got {value!r}")
    if isinstance(value, int | float):
        if value != value:
            raise DurationError(f"expected a duration like '5m' or seconds, got {value!r}")
        if value < 0 or value * SECOND >= FOREVER:
            return FOREVER
        return _float_to_duration(float(value))
    if not isinstance(value, str) or not value.strip():
        raise DurationError(f"expected a duration like '5m' or seconds, got {value!r}")
    text = value.strip()
    try:
        ns = parse_go_duration(text)
    except DurationError:
        try:
            # Ollama takes whole seconds here; a YAML number may also have a fraction.
            number = float(text)
        except ValueError:
            raise DurationError(
                f"expected a duration like '5m' or seconds, got {value!r}"
            ) from None
        return parse_keep_alive_setting(number)
    return FOREVER if ns < 0 else ns


def seconds(ns: int) -> float:
    """Nanoseconds as float seconds (for timers and for /sim/state)."""
    return ns / SECOND
