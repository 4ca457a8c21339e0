"""Where the rules across fields of consumers.yaml report, by dotted field path."""

from __future__ import annotations

from typing import Protocol


class Findings(Protocol):
    """Where the rules report, by dotted field path; the file positions are known there."""

    def report(self, path: str, message: str) -> None:
        """An error at `path` (or its nearest written ancestor)."""

    def warn(self, path: str, message: str) -> None:
        """A warning at `path`."""

    def line_of(self, path: str) -> int | None:
        """The line `path` is written on; None when the file leaves it out."""

    def has_errors_under(self, path: str) -> bool:
        """Whether an error was already reported at `path` or inside it."""
