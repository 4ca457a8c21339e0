"""Processes for the simulated-host tests: real PIDs to hold memory, and bounded line reads."""

from __future__ import annotations

import contextlib
import queue
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

LINE_TIMEOUT = 20.0
"""Upper bound for one expected line; a hang fails the test instead of blocking the run."""


@contextlib.contextmanager
def sleepers(count: int) -> Iterator[list[subprocess.Popen[bytes]]]:
    """`count` live `sleep` processes whose PIDs can hold simulated memory; killed after."""
    procs = [subprocess.Popen(["sleep", "600"]) for _ in range(count)]
    try:
        yield procs
    finally:
        for proc in procs:
            proc.kill()
            proc.wait(timeout=10)


def pid_exists(pid: int) -> bool:
    """True while /proc has an entry for `pid` (zombies included)."""
    return Path(f"/proc/{pid}").exists()


def parent_pid(pid: int) -> int:
    """PPid of a live process, from /proc/<pid>/status."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("PPid:"):
            return int(line.split()[1])
    raise AssertionError(f"no PPid line for {pid}")


def cmdline(pid: int) -> list[str]:
    """The words of /proc/<pid>/cmdline, without the empty fields of a rewritten title."""
    raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    return [word.decode() for word in raw.split(b"\0") if word]


def comm(pid: int) -> str:
    return Path(f"/proc/{pid}/comm").read_text().rstrip("\n")


class LineReader:
    """Reads a pipe's lines on a thread so a test can wait for one with a timeout."""

    def __init__(self, pipe: object) -> None:
        self._lines: queue.Queue[str | None] = queue.Queue()
        self.seen: list[str] = []
        threading.Thread(target=self._pump, args=(pipe,), daemon=True).start()

    def _pump(self, pipe: object) -> None:
        with contextlib.suppress(OSError, ValueError):
            for raw in pipe:  # type: ignore[attr-defined]
                line = raw.decode() if isinstance(raw, bytes) else raw
                self._lines.put(line.rstrip("\n"))
        self._lines.put(None)

    def next(self, timeout: float = LINE_TIMEOUT) -> str | None:
        """The next line, or None at EOF; AssertionError after `timeout` seconds."""
        try:
            line = self._lines.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"no line within {timeout}s; lines so far: {self.seen}") from None
        if line is not None:
            self.seen.append(line)
        return line

    def until(self, prefix: str, timeout: float = LINE_TIMEOUT) -> str:
        """Skip lines until one starts with `prefix`; AssertionError at EOF."""
        while True:
            line = self.next(timeout)
            if line is None:
                raise AssertionError(f"EOF before a line starting {prefix!r}: {self.seen}")
            if line.startswith(prefix):
                return line

    def rest(self, timeout: float = LINE_TIMEOUT) -> list[str]:
        """Every remaining line up to EOF."""
        lines = []
        while (line := self.next(timeout)) is not None:
            lines.append(line)
        return lines


def kill_quietly(proc: subprocess.Popen[str] | subprocess.Popen[bytes]) -> None:
    """Teardown for a test whose subject may have failed to stop by itself."""
    if proc.poll() is None:
        proc.kill()
        proc.wait(timeout=10)


def processes_with(token: str) -> list[int]:
    """PIDs whose command line contains `token`: what a test left running, if anything."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            raw = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if token.encode() in raw:
            found.append(int(entry.name))
    return found
