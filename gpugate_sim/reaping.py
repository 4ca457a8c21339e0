"""Leaving no process behind: subreaping, killing what is left of process groups.

A simulated host's children can outlive the child that started them (a holder killed
before it could stop its own children); the host process makes itself their subreaper so
they come back to it, and kills and reaps whatever is left when it stops.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import select
import signal
from pathlib import Path

import attrs

PR_SET_CHILD_SUBREAPER = 36


def reap_orphans() -> None:
    """Kill and reap every child left, ours or handed to us; for the `sim run` process only."""
    while True:
        for row in _process_table():
            if row.ppid == os.getpid():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(row.pid, signal.SIGKILL)
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:
            return


def become_subreaper() -> None:
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


@attrs.frozen
class _ProcessRow:
    pid: int
    ppid: int
    pgid: int


def _process_table() -> list[_ProcessRow]:
    rows = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_bytes()
        except OSError:
            continue
        # Fields after the parenthesised command: state, ppid, pgrp, ...
        fields = stat[stat.rindex(b")") + 2 :].split()
        rows.append(_ProcessRow(int(entry.name), int(fields[1]), int(fields[2])))
    return rows


def clear_groups(groups: set[int], timeout: float) -> None:
    """Kill what is left of these process groups and reap the members handed to us.

    A member outlives its group leader when the leader had to be killed before it could
    stop its own children; as subreaper this process inherits it once it is orphaned.
    """
    stragglers = [row.pid for row in _process_table() if row.pgid in groups]
    for pid in stragglers:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    for pid in stragglers:
        _wait_dead(pid, timeout)
    # Every straggler has died, so every orphan among them has been handed over by now.
    for row in _process_table():
        if row.pgid in groups and row.ppid == os.getpid():
            with contextlib.suppress(ChildProcessError):
                os.waitpid(row.pid, 0)


def _wait_dead(pid: int, timeout: float) -> None:
    """Block until `pid` has died (is a zombie or gone), at most `timeout` seconds."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    try:
        select.select([fd], [], [], timeout)
    finally:
        os.close(fd)
