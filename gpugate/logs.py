"""Logging that a flood cannot turn into a flood of log lines."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import attrs


@attrs.define
class _Seen:
    first_at: float
    suppressed: int = 0


class OncePerInterval:
    """Logs the first occurrence of each key, then at most one line per interval with a count.

    A repeated error (a refused accept, an upstream that keeps failing) is one line per
    `interval` seconds saying how many times it happened, never a line per occurrence.
    """

    def __init__(
        self,
        logger: logging.Logger,
        interval: float = 60.0,
        *,
        clock: Callable[[], float] = time.monotonic,
        max_keys: int = 1024,
    ) -> None:
        self.logger = logger
        self.interval = interval
        self.clock = clock
        self.max_keys = max_keys
        self._seen: dict[str, _Seen] = {}

    def log(self, level: int, key: str, message: str, *args: object) -> bool:
        """Log `message` under `key` unless it was logged less than an interval ago.

        Returns whether a line was written.
        """
        now = self.clock()
        seen = self._seen.get(key)
        if seen is not None and now - seen.first_at < self.interval:
            seen.suppressed += 1
            return False
        repeats = seen.suppressed if seen is not None else 0
        if seen is None and len(self._seen) >= self.max_keys:
            self._seen.clear()
        self._seen[key] = _Seen(now)
        if repeats:
            message = f"{message} (and {repeats} more like it in the last {self.interval:g}s)"
        self.logger.log(level, message, *args)
        return True

    def warning(self, key: str, message: str, *args: object) -> bool:
        return self.log(logging.WARNING, key, message, *args)

    def error(self, key: str, message: str, *args: object) -> bool:
        return self.log(logging.ERROR, key, message, *args)
