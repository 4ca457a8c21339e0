"""A repeated message is logged once per interval, with a count of what was held back."""

from __future__ import annotations

import logging

from gpugate.logs import OncePerInterval


def test_repeats_are_counted_not_logged(caplog):
    now = [0.0]
    limiter = OncePerInterval(logging.getLogger("t.logs"), 10.0, clock=lambda: now[0])
    with caplog.at_level(logging.WARNING, logger="t.logs"):
        written = [limiter.warning("accept", "accept failed: %s", "EMFILE") for _ in range(1000)]
        now[0] = 10.5
        limiter.warning("accept", "accept failed: %s", "EMFILE")
        limiter.warning("other", "another thing")
    assert written.count(True) == 1
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [
        "accept failed: EMFILE",
        "accept failed: EMFILE (and 999 more like it in the last 10s)",
        "another thing",
    ]
