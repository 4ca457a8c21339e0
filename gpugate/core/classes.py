"""Priority classes and residency policies: the vocabulary every decision is made in."""

from __future__ import annotations

import enum


class PriorityClass(enum.IntEnum):
    """Who is served first. A larger value is a higher class.

    Priority is not preemption: a higher class may take memory from an *idle* lower one,
    never from a request in flight (a job consumer's `preempt` is the one opt-in
    exception: `core/preemption.py`).
    """

    MAINTENANCE = 1
    BENCHMARK = 2
    BACKGROUND = 3
    INTERACTIVE = 4
    PRODUCTION = 5

    @property
    def label(self) -> str:
        return self.name.lower()

    @classmethod
    def parse(cls, text: str) -> PriorityClass:
        try:
            return cls[text.strip().upper()]
        except KeyError:
            names = ", ".join(c.label for c in cls.ordered())
            raise ValueError(f"unknown priority class {text!r} (one of {names})") from None

    @classmethod
    def ordered(cls) -> list[PriorityClass]:
        """Highest first."""
        return sorted(cls, reverse=True)


class ResidencyPolicy(enum.Enum):
    """How long a model stays in VRAM once its last request is done."""

    ALWAYS_WARM = "always_warm"
    """Never unloaded for idleness; yields memory only to production."""
    KEEP_WARM = "keep_warm"
    """Stays for a TTL after the last request, then the gate unloads it."""
    LOAD_ON_DEMAND = "load_on_demand"
    """Unloaded as soon as its last request is done."""

    @classmethod
    def parse(cls, text: str) -> ResidencyPolicy:
        try:
            return cls(text.strip().lower())
        except ValueError:
            raise ValueError(
                f"unknown residency policy {text!r} (one of {', '.join(p.value for p in cls)})"
            ) from None
