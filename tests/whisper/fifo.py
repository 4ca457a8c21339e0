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


def open_once(path: Path) -> None:
    """Let the reader that is opening `path` have it, empty (std::ifstream in server.cpp's
    `is_file_exist` opens it and closes it unread)."""
    os.close(os.open(path, os.O_WRONLY))  # returns once a reader has it open


def feed(path: Path, data: bytes) -> None:
    """Open the pipe for writing (waiting for its next reader) and write `data` whole."""
    with open(path, "wb") as pipe:
        pipe.write(data)
