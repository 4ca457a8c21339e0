"""The protocol between a simulated-host process and the children it starts.

A child prints one ready line (`READY ...`) on stdout when it is ready, and exits when it
is told to stop (SIGTERM) or when its parent dies. The parent waits for the ready lines of
everything it started and turns a child that exits early into `ChildFailed`. Used by the
holders (for their own children) and by `gpugate sim run` (for holders and Ollama).
"""

from __future__ import annotations

import contextlib
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from typing import TextIO

import attrs

READY = "READY"
EXIT_OOM = 3
"""A CUDA program that cannot get its memory aborts; a simulated one exits with 3."""
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
DEFAULT_READY_TIMEOUT = 20.0
DEFAULT_STOP_GRACE = 3.0


@attrs.frozen
class Ready:
    """A child printed its ready line."""

    child: ReadyProcess
    line: str


@attrs.frozen
class Exited:
    """A child closed its stdout: it has exited or is about to."""

    child: ReadyProcess


@attrs.frozen
class StopRequested:
    """SIGTERM or SIGINT arrived."""

    signal: int


Event = Ready | Exited | StopRequested


class ChildFailed(Exception):
    """A child exited, or stayed silent too long, before it was ready."""

    def __init__(self, child: ReadyProcess, reason: str, returncode: int | None = None) -> None:
        super().__init__(f"{child.label} {reason}")
        self.child = child
        self.reason = reason
        self.returncode = returncode


class Stopped(Exception):
    """A stop signal arrived while waiting for a child."""


class ReadyProcess:
    """A child process that announces readiness with one stdout line starting with `prefix`.

    A reader thread turns the child's stdout into events on a shared queue (`Ready` once,
    `Exited` at EOF); every other line is copied to `output` behind `[label]`, so a chatty
    child never blocks on a full pipe. Lines before the ready line are also kept in
    `preamble` (and not copied when `forward_preamble` is false).
    """

    def __init__(
        self,
        label: str,
        argv: Sequence[str],
        events: queue.SimpleQueue[Event],
        *,
        prefix: str = READY,
        env: dict[str, str] | None = None,
        own_group: bool = False,
        output: TextIO | None = None,
        forward_preamble: bool = True,
    ) -> None:
        self.label = label
        self.argv = list(argv)
        self.events = events
        self.prefix = prefix
        self.env = env
        self.own_group = own_group
        self.output = output if output is not None else sys.stderr
        self.popen: subprocess.Popen[str] | None = None
        self.ready_line: str | None = None
        self.preamble: list[str] = []
        self.forward_preamble = forward_preamble

    @property
    def pid(self) -> int:
        assert self.popen is not None, "not started"
        return self.popen.pid

    def start(self) -> None:
        """Start the child and its stdout reader."""
        self.popen = subprocess.Popen(
            self.argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            text=True,
            errors="replace",
            bufsize=1,
            env=self.env,
            start_new_session=self.own_group,
        )
        threading.Thread(target=self._read, name=f"stdout of {self.label}", daemon=True).start()

    def wait_ready(self, timeout: float) -> str:
        """Block until this child is ready; other children's events are passed over.

        Raises ChildFailed (exited, or silent for `timeout` seconds) or Stopped.
        """
        deadline = time.monotonic() + timeout
        passed_over: list[Event] = []
        try:
            while True:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise ChildFailed(self, f"did not print {self.prefix} within {timeout:g}s")
                try:
                    event = self.events.get(timeout=remaining)
                except queue.Empty:
                    continue
                if isinstance(event, StopRequested):
                    raise Stopped()
                if isinstance(event, Ready) and event.child is self:
                    return event.line
                if isinstance(event, Exited) and event.child is self:
                    code = self.wait(timeout=DEFAULT_STOP_GRACE)
                    raise ChildFailed(self, f"exited with {describe_exit(code)}", code)
                passed_over.append(event)
        finally:
            # Another child's exit still matters to whoever waits on the queue next.
            for event in passed_over:
                self.events.put(event)

    def signal(self, signum: int) -> None:
        """Send a signal to the child (to its whole process group when it has its own)."""
        # Only while unreaped: after that its PID (and group ID) may belong to someone else.
        if self.popen is None or self.popen.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            if self.own_group:
                os.killpg(self.popen.pid, signum)
            else:
                self.popen.send_signal(signum)

    def wait(self, timeout: float) -> int | None:
        """The exit code after at most `timeout` seconds, or None if it is still running."""
        assert self.popen is not None, "not started"
        try:
            return self.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None

    def _read(self) -> None:
        # Stop signals are for the main thread, which owns the waiting and the cleanup.
        signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
        assert self.popen is not None and self.popen.stdout is not None
        with contextlib.suppress(OSError, ValueError):
            for line in self.popen.stdout:
                line = line.rstrip("\n")
                if self.ready_line is None and line.startswith(self.prefix):
                    self.ready_line = line
                    self.events.put(Ready(self, line))
                elif self.ready_line is None:
                    self.preamble.append(line)
                    if self.forward_preamble:
                        self._forward(line)
                else:
                    self._forward(line)
        self.events.put(Exited(self))

    def _forward(self, line: str) -> None:
        with contextlib.suppress(OSError, ValueError):
            self.output.write(f"[{self.label}] {line}\n")
            self.output.flush()


def describe_exit(code: int | None) -> str:
    """An exit status in words: 'code 3 (out of GPU memory)', 'signal SIGKILL'."""
    if code is None:
        return "no exit status yet"
    if code < 0:
        try:
            return f"signal {signal.Signals(-code).name}"
        except ValueError:
            return f"signal {-code}"
    if code == EXIT_OOM:
        return f"code {code} (out of GPU memory)"
    return f"code {code}"


def stop_all(children: Sequence[ReadyProcess], grace: float = DEFAULT_STOP_GRACE) -> None:
    """SIGTERM every child, SIGKILL what is left after `grace` seconds, and reap them all."""
    for child in children:
        child.signal(signal.SIGTERM)
    deadline = time.monotonic() + grace
    for child in children:
        if child.popen is not None:
            child.wait(timeout=max(0.0, deadline - time.monotonic()))
    for child in children:
        if child.popen is not None:
            child.signal(signal.SIGKILL)
            child.wait(timeout=grace)


def install_stop_handlers(events: queue.SimpleQueue[Event]) -> None:
    """Turn SIGTERM and SIGINT into StopRequested events (SimpleQueue.put is signal-safe)."""

    def handler(signum: int, frame: object) -> None:
        events.put(StopRequested(signum))

    for signum in STOP_SIGNALS:
        signal.signal(signum, handler)
