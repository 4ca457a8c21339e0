"""Reading one field of a simulated host's YAML: the checks every part of it shares, each
error naming the field's path."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gpugate.core.units import parse_duration, parse_size


def only(data: Any, where: str, allowed: set[str]) -> None:
    """Refuse what is not a mapping, or has keys outside `allowed`."""
    if not isinstance(data, dict):
        raise ValueError(f"{where}: expected a mapping, got {type(data).__name__}")
    unknown = set(data) - allowed
    if unknown:
        raise ValueError(f"{where}: unknown key(s) {', '.join(sorted(map(str, unknown)))}")


def duration(data: dict[str, Any], key: str, where: str, default: float) -> float:
    """`data[key]` as seconds (a duration like "5s"), `default` when absent."""
    try:
        return parse_duration(data.get(key, default))
    except ValueError as exc:
        raise ValueError(f"{where}.{key}: {exc}") from None


def number(
    data: dict[str, Any],
    key: str,
    where: str,
    kind: type[int] | type[float],
    default: float,
    *,
    minimum: float | None = None,
    positive: bool = False,
) -> Any:
    """`data[key]` as a number of `kind`, checked against its bounds."""
    value = data.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{where}.{key}: expected a number, got {value!r}")
    if kind is int and value != int(value):
        raise ValueError(f"{where}.{key}: expected a whole number, got {value!r}")
    if minimum is not None and value < minimum:
        raise ValueError(f"{where}.{key}: must be at least {minimum}, got {value!r}")
    if positive and not value > 0:
        raise ValueError(f"{where}.{key}: must be positive, got {value!r}")
    return kind(value)


def field_size(data: dict[str, Any], key: str, where: str, default: int) -> int:
    """`data[key]` as bytes (a size like "2GiB"), `default` when absent."""
    try:
        return parse_size(data.get(key, default))
    except ValueError as exc:
        raise ValueError(f"{where}.{key}: {exc}") from None


def record_path(data: dict[str, Any], where: str, base: Path) -> Path | None:
    """`data["record"]`: a file a runtime appends its records to, None when absent.

    A relative path is taken from the host file's directory, so that the processes of a
    host, whatever their working directory, write where the file says.
    """
    value = data.get("record")
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        raise ValueError(f"{where}.record: expected a file path, got {value!r}")
    return base / Path(value).expanduser()
