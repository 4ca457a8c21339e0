"""`ollama.faults` of a HOST.yaml: faults the simulated Ollama starts with."""

from __future__ import annotations

import enum
from typing import Any

import attrs


class PsFault(enum.Enum):
    NONE = "none"
    GARBAGE = "garbage"


@attrs.frozen
class FaultSpec:
    """The switches a HOST.yaml may set under `ollama.faults`."""

    ps: PsFault = PsFault.NONE
    keep_memory: bool = False


def parse_faults(data: Any, where: str = "ollama.faults") -> FaultSpec:
    """`ollama.faults` of a HOST.yaml; ValueError naming the field otherwise."""
    if data is None:
        return FaultSpec()
    if not isinstance(data, dict):
        raise ValueError(f"{where}: expected a mapping")
    unknown = set(data) - {"ps", "keep_memory"}
    if unknown:
        raise ValueError(f"{where}: unknown key(s) {', '.join(sorted(map(str, unknown)))}")
    try:
        ps = PsFault(data.get("ps", "none"))
    except ValueError:
        raise ValueError(f"{where}.ps: expected none or garbage, got {data['ps']!r}") from None
    keep = data.get("keep_memory", False)
    if not isinstance(keep, bool):
        raise ValueError(f"{where}.keep_memory: expected true or false, got {keep!r}")
    return FaultSpec(ps, keep)
