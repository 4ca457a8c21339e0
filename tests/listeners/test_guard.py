"""The pieces of the listener guard that need no sockets: fd budgeting and loop errors."""

from __future__ import annotations

import asyncio
import errno
import logging

import pytest

from gpugate.proxy import runners
from gpugate.proxy.runners import FD_PER_LISTENER, FD_RESERVE, fit_caps, quiet_loop_errors


def test_caps_that_fit_the_fd_limit_are_kept():
    assert fit_caps([(1024, 2), (1024, 1)], 65536) == [1024, 1024]


def test_caps_past_the_fd_limit_are_scaled_down_to_fit():
    caps = fit_caps([(1024, 2), (1024, 1)], 1024)
    assert caps[0] < 1024 and caps[1] < 1024
    assert caps[0] * 2 + caps[1] <= 1024 - FD_RESERVE - 2 * FD_PER_LISTENER


def test_a_repeated_accept_error_is_logged_once_with_a_count(caplog, monkeypatch):
    now = [0.0]
    monkeypatch.setattr(runners.loop_errors, "clock", lambda: now[0])
    monkeypatch.setattr(runners.loop_errors, "_seen", {})
    loop = asyncio.new_event_loop()
    context = {
        "message": "socket.accept() out of system resource",
        "exception": OSError(errno.EMFILE, "Too many open files"),
    }
    try:
        with caplog.at_level(logging.ERROR, logger="gpugate.loop"):
            for _ in range(10000):
                quiet_loop_errors(loop, context)
            now[0] = 31.0
            quiet_loop_errors(loop, context)
    finally:
        loop.close()
    messages = [r.getMessage() for r in caplog.records]
    assert messages == [
        "socket.accept() out of system resource: [Errno 24] Too many open files",
        "socket.accept() out of system resource: [Errno 24] Too many open files "
        "(and 9999 more like it in the last 30s)",
    ]
    assert all(r.exc_info is None for r in caplog.records)


@pytest.mark.parametrize("exc", [ValueError("boom")])
def test_another_loop_error_is_logged_with_its_traceback_once(caplog, monkeypatch, exc):
    monkeypatch.setattr(runners.loop_errors, "_seen", {})
    loop = asyncio.new_event_loop()
    try:
        with caplog.at_level(logging.ERROR, logger="gpugate.loop"):
            for _ in range(100):
                quiet_loop_errors(loop, {"message": "Task exception", "exception": exc})
    finally:
        loop.close()
    (record,) = caplog.records
    assert record.getMessage().startswith("Task exception\nValueError: boom")
