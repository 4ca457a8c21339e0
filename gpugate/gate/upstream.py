"""The gate's own calls to a runtime (listings, unloads, sizing): their failures by class,
and the back-off of a loop that keeps failing.

A call that passes its bound is TIMEOUT, one that cannot connect (or loses its
connection) is RUNTIME_CRASH, and an answer the gate cannot use is INVALID_OUTPUT.
"""

from __future__ import annotations

import aiohttp
import attrs

from gpugate.config.model import Consumer
from gpugate.core.failures import Failure, FailureClass


def failure_class(exc: BaseException) -> FailureClass:
    """The class of a failed call to a runtime."""
    # Timeouts first: aiohttp's own timeout errors are also ClientErrors, and every
    # TimeoutError is an OSError.
    if isinstance(exc, TimeoutError):
        return FailureClass.TIMEOUT
    if isinstance(exc, (aiohttp.ClientError, OSError)):
        return FailureClass.RUNTIME_CRASH
    return FailureClass.INVALID_OUTPUT


def upstream_failure(
    consumer: Consumer, exc: BaseException, what: str, *, model: str | None = None
) -> Failure:
    """A failure event for a call the gate made to `consumer`'s runtime."""
    cls = failure_class(exc)
    where = f"{consumer.name} upstream {consumer.upstream.url}"
    if cls is FailureClass.TIMEOUT:
        why = f"{where} did not answer within {consumer.timeouts.control:g}s"
    elif cls is FailureClass.RUNTIME_CRASH:
        why = f"{where} did not answer ({exc or type(exc).__name__})"
    else:
        why = f"{where} answered what the gate cannot use ({exc or type(exc).__name__})"
    return Failure(
        cls,
        f"{cls.value}: {what}: {why}",
        consumer=consumer.name,
        model=model,
        gpu=consumer.cards[0],
    )


@attrs.define
class Backoff:
    """Bounded exponential back-off: base, 2·base, 4·base ... up to ceiling."""

    base: float
    ceiling: float
    failures: int = 0

    def failed(self) -> float:
        """Count a failure; returns how long to wait before trying again."""
        self.failures += 1
        return min(self.ceiling, self.base * 2 ** min(self.failures - 1, 30))

    def succeeded(self) -> None:
        self.failures = 0
