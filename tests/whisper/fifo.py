"""A model file that is a named pipe: whoever opens it to read waits until the test opens it
to write, so a load can be held at a known point and looked at there, with no timing."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

WAIT = 60.0


def make_fifo(path: Path) -> Path:
    os.mkfifo(path)
    return path


def wait_until(condition: Callable[[], bool], what: str, seconds: float = WAIT) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def hold(path: Path) -> int:
    """Open the pipe for writing, once a reader opens it, and keep it open: every reader
    that opens it from then on opens at once and waits for data (`feed_held`), none meets
    an end. A /load opens its model twice: server.cpp's `is_file_exist` (a std::ifstream,
    closed unread), then `whisper_init`; a writer closed between the two (as soon as the
    first open returned) could still be open when the second came, which then read an
    empty file ("bad magic") and the server exited 1."""
    return os.open(path, os.O_WRONLY)  # returns once a reader has it open


def reading(pid: int, path: Path) -> bool:
    """Whether process `pid` has `path` open."""
    fds = Path(f"/proc/{pid}/fd")
    try:
        entries = list(fds.iterdir())
    except OSError:
        return False
    for entry in entries:
        try:
            if os.readlink(entry) == str(path):
                return True
        except OSError:
            continue
    return False


def feed_held(fd: int, data: bytes) -> None:
    """Write `data` whole to the pipe held open by `hold`, then close it (its end)."""
    with os.fdopen(fd, "wb") as pipe:
        pipe.write(data)


def feed(path: Path, data: bytes) -> None:
    """Open the pipe for writing (waiting for its next reader) and write `data` whole."""
    with open(path, "wb") as pipe:
        pipe.write(data)
