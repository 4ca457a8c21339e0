"""`gpugate sim run` as a child process: for tests and `gpugate demo`."""

from __future__ import annotations

import queue
import signal
import sys
from pathlib import Path
from types import TracebackType

from gpugate_sim.children import DEFAULT_STOP_GRACE, ChildFailed, Event, ReadyProcess
from gpugate_sim.host import READY_COMMENT, HostEnvironment, HostStartError


class SimulatedHostProcess:
    """`gpugate sim run HOST.yaml` as a child process, for tests and `gpugate demo`.

    start() returns once the host is ready, with `environment` read from its output.
    """

    def __init__(
        self,
        host_file: Path,
        state_dir: Path | None = None,
        *,
        timeout: float = 60.0,
        env: dict[str, str] | None = None,
    ) -> None:
        self.host_file = host_file
        self.state_dir = state_dir
        self.timeout = timeout
        self.env = env
        self.events: queue.SimpleQueue[Event] = queue.SimpleQueue()
        self.process: ReadyProcess | None = None
        self.environment: HostEnvironment | None = None
        self.ready_line: str | None = None

    @property
    def pid(self) -> int:
        assert self.process is not None, "not started"
        return self.process.pid

    def command(self) -> list[str]:
        """The command line of `gpugate sim run` (a subclass may run it elsewhere)."""
        argv = [sys.executable, "-m", "gpugate", "sim", "run", str(self.host_file)]
        if self.state_dir is not None:
            argv += ["--state-dir", str(self.state_dir)]
        return argv

    def start(self) -> SimulatedHostProcess:
        """Start `gpugate sim run`; HostStartError when it exits or stays silent instead."""
        self.process = ReadyProcess(
            "gpugate sim run",
            self.command(),
            self.events,
            prefix=READY_COMMENT,
            env=self.env,
            forward_preamble=False,
        )
        self.process.start()
        try:
            self.ready_line = self.process.wait_ready(self.timeout)
        except ChildFailed as exc:
            self.stop()
            raise HostStartError(str(exc)) from None
        self.environment = HostEnvironment.from_lines(self.process.preamble)
        return self

    def stop(self, timeout: float = 2 * DEFAULT_STOP_GRACE + 5.0) -> int | None:
        """SIGTERM it and wait for its exit code (SIGKILL after `timeout` seconds)."""
        if self.process is None:
            return None
        self.process.signal(signal.SIGTERM)
        code = self.process.wait(timeout)
        if code is None:
            self.process.signal(signal.SIGKILL)
            code = self.process.wait(timeout)
        return code

    def __enter__(self) -> SimulatedHostProcess:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


# -- the command ---------------------------------------------------------------------------------
