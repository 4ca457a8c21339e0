"""What a request, or a lease's holder, is told when the gate cannot give it what it asked."""

from __future__ import annotations

from gpugate.core.failures import Failure


class GateFailure(Exception):
    """A request cannot be admitted; carries the failure to tell its client."""

    def __init__(self, failure: Failure) -> None:
        super().__init__(failure.message)
        self.failure = failure
