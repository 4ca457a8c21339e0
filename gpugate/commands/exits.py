"""The exit codes of the `gpugate` commands: sysexits(3) codes, each for what it means.

What a caller most needs from a code is whether the same command can succeed later:
only TEMPFAIL says so. Every other failure stays until someone changes the command
line, the configuration, the token or the gate. docs/operations.md#exit-codes is this
table in prose; `gpugate lease -- CMD` exits with CMD's own code once CMD ran.
"""

from __future__ import annotations

import enum

from gpugate.core.failures import FailureClass


class Exit(enum.IntEnum):
    """An exit code of a `gpugate` command."""

    OK = 0
    """Done: the view shown, the action taken, the lease granted."""
    USAGE = 64
    """EX_USAGE: the command line is wrong (an option, a size, a duration or a class)."""
    DATAERR = 65
    """EX_DATAERR: the gate refused the request as asked (unknown name, too large, no envelope)."""
    UNAVAILABLE = 69
    """EX_UNAVAILABLE: no gate answers at the control address (for status, nor NVML)."""
    TEMPFAIL = 75
    """EX_TEMPFAIL: no room now, or busy; the same command later can succeed."""
    NOPERM = 77
    """EX_NOPERM: the gate refused the token (none, not valid, or an identity's)."""
    CONFIG = 78
    """EX_CONFIG: no configuration file where one is looked for, or it does not load."""


INTERRUPTED = 128 + 2
"""Ctrl-C (SIGINT), by the shell's convention of 128 + the signal."""


def for_answer(status: int, failure: str | None) -> Exit:
    """The code for a gate's refusal, from its HTTP status and failure class.

    The gate's 503s are its capacity answers, all with Retry-After. A 409 is a refusal
    that retrying cannot change, except RESIDENCY_CONFLICT for a resident that is busy
    (serving, loading or unloading) now.
    """
    if status in (401, 403):
        return Exit.NOPERM
    if status == 503:
        return Exit.TEMPFAIL
    if status == 409 and failure == FailureClass.RESIDENCY_CONFLICT.value:
        return Exit.TEMPFAIL
    if 400 <= status < 500:
        return Exit.DATAERR
    return Exit.UNAVAILABLE
