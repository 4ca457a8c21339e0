"""whisper-server's stdout and stderr as C's stdio has them.

* stdout is line-buffered on a terminal and fully buffered otherwise (a pipe, a file):
  what the server `printf`s — "whisper server listening at ..." among it — reaches a pipe
  when the buffer fills or at exit, whatever Python's own settings (`-u`,
  PYTHONUNBUFFERED) would have made of it;
* stderr is unbuffered;
* a write to a pipe whose reader is gone kills the process with SIGPIPE, as it does a C
  program (Python ignores SIGPIPE and raises BrokenPipeError instead). The HTTP sockets
  are not concerned: cpp-httplib sends with MSG_NOSIGNAL.
"""

from __future__ import annotations

import contextlib
import io
import os
import signal
import sys
from typing import TextIO

BUFSIZ = 4096
"""glibc's buffer for a pipe: its st_blksize, one page."""


def die_of_sigpipe() -> None:
    """End the process as a C program writing to a pipe nobody reads."""
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGPIPE)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGPIPE})
    os._exit(128 + signal.SIGPIPE)  # only if SIGPIPE could not be delivered


class CStream(io.TextIOWrapper):
    """A text stream over a file descriptor with C stdio's buffering and SIGPIPE."""

    unbuffered = False

    def write(self, text: str) -> int:
        try:
            written = super().write(text)
            if self.unbuffered:
                super().flush()
        except BrokenPipeError:
            die_of_sigpipe()
            raise
        return written

    def flush(self) -> None:
        try:
            super().flush()
        except BrokenPipeError:
            die_of_sigpipe()
            raise


def c_stream(fd: int, *, buffered: bool) -> TextIO:
    """`fd` as C opens stdout (`buffered`) or stderr (unbuffered)."""
    raw = io.FileIO(fd, "w", closefd=False)
    tty = raw.isatty()
    binary = io.BufferedWriter(raw, buffer_size=BUFSIZ)
    stream = CStream(binary, encoding="utf-8", errors="replace", line_buffering=buffered and tty)
    stream.unbuffered = not buffered
    return stream


def install() -> tuple[TextIO, TextIO]:
    """Make sys.stdout and sys.stderr C's; (stdout, stderr)."""
    for old in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            old.flush()
    sys.stdout = c_stream(1, buffered=True)
    sys.stderr = c_stream(2, buffered=False)
    return sys.stdout, sys.stderr
