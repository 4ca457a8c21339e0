"""When a process runtime whose starts keep failing may be started again."""

from __future__ import annotations

import attrs

BACKOFF_BASE = 1.0
BACKOFF_MAX = 300.0
STABLE_AFTER = 60.0
"""A process that ran this long before it ended was not crash-looping: its backoff resets."""


@attrs.define
class StartBackoff:
    """Starts of one process runtime after failures: 1 s, 2 s, 4 s ... up to 5 minutes."""

    failures: int = 0
    not_before: float = 0.0
    ready_at: float | None = None

    def failed(self, now: float) -> float:
        """Count a failed start or a crash; returns the seconds until the next start."""
        if self.ready_at is not None and now - self.ready_at >= STABLE_AFTER:
            self.failures = 0
        self.ready_at = None
        self.failures += 1
        delay = min(BACKOFF_MAX, BACKOFF_BASE * 2 ** min(self.failures - 1, 30))
        self.not_before = now + delay
        return delay

    def ready(self, now: float) -> None:
        """The process answers; failures are forgotten once it stays up (`STABLE_AFTER`)."""
        self.ready_at = now

    def remaining(self, now: float) -> float:
        return max(0.0, self.not_before - now)
