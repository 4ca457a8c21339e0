"""Starting and stopping a runtime that holds its model for its whole life (whisper-server).

Such a runtime frees its VRAM only by exiting, so the gate controls it as a process, through
the lifecycle interface here (`ProcessControl`), how it ended (`Exit`) and its errors:

* `SystemdUnit(unit)` (process_systemd.py): `systemctl start|stop|is-active UNIT`, each
  bounded by a timeout, when the runtime is a systemd service (its ExecStartPre may run
  `gpugate admit`).
* `SupervisedCommand(argv, env, cwd)` (process_supervised.py): the gate runs the command
  itself as its child, stops it with SIGTERM then SIGKILL after a grace, reaps it, and
  reports how it ended (status, signal, the last lines of its stderr), including when it
  died on its own.

A process found running (`process_find.py`) is adopted: `adopt(pid)`. Waiting for a
started one to answer is `process_ready.wait_ready`.

Nothing here knows the gate: it is asyncio and subprocesses only.
"""

from __future__ import annotations

import abc
import asyncio
import signal
from typing import ClassVar

import attrs

from gpugate.core.lifecycle import LifeReport
from gpugate.runtimes.footprint import Cap


class ProcessControlError(RuntimeError):
    """A start, stop or query could not be carried out; `stderr` is the tool's own words."""

    def __init__(self, message: str, *, stderr: str = "", returncode: int | None = None) -> None:
        super().__init__(f"{message}: {stderr.strip()}" if stderr.strip() else message)
        self.stderr = stderr
        self.returncode = returncode


class SystemctlError(ProcessControlError):
    """`systemctl` failed, timed out or could not be run."""


class ProcessExited(ProcessControlError):
    """The process ended before it was ready (a start that failed, an OOM abort)."""

    def __init__(self, exit: Exit) -> None:
        super().__init__(
            f"the process exited before it was ready ({exit.describe()})",
            stderr="\n".join(exit.stderr_tail),
            returncode=exit.returncode,
        )
        self.exit = exit


class NotReady(ProcessControlError):
    """The runtime did not accept connections, or its health check did not answer 200, in time."""


@attrs.frozen
class Exit:
    """How a supervised process ended."""

    returncode: int | None
    """As asyncio reports it: the exit status, or -N when signal N ended it (SIGABRT: -6);
    None for a process the gate adopted (not its child: its status is not the gate's to see)."""
    stderr_tail: tuple[str, ...] = ()
    """Its last stderr lines, oldest first."""
    stopped: bool = False
    """True when the gate stopped it (`stop()`); False when it ended on its own."""

    @property
    def signal(self) -> int | None:
        """The signal that ended it, if one did."""
        return -self.returncode if self.returncode is not None and self.returncode < 0 else None

    @property
    def shell_status(self) -> int | None:
        """The status a shell (and systemd's `$EXIT_STATUS`) shows: 128 + N for signal N."""
        if self.returncode is None:
            return None
        return 128 - self.returncode if self.returncode < 0 else self.returncode

    def describe(self) -> str:
        """'exit status 3' or 'killed by SIGABRT (status 134)'."""
        if self.returncode is None:
            return "ended (an adopted process: its status is unknown)"
        if self.signal is None:
            return f"exit status {self.returncode}"
        try:
            name = signal.Signals(self.signal).name
        except ValueError:
            name = f"signal {self.signal}"
        return f"killed by {name} (status {self.shell_status})"


class ProcessControl(abc.ABC):
    """A runtime's lifecycle interface: start and stop its process (sleep and wake it, where
    it can); how is the implementation's business. The gate carries out the core's Start,
    Stop, Sleep and Wake effects through it and reports what became of them."""

    owns_port: ClassVar[bool] = True
    """Whether a process serving the runtime's port is the runtime running (adopted rather
    than started twice). False for a control whose own state says: a server put to sleep
    keeps its port while its memory is given back."""

    @abc.abstractmethod
    async def start(self, devices: str | None = None, cap: Cap | None = None) -> None:
        """Start it; returns once it was started (not once it is ready: see `wait_ready`).

        `devices`: the GPU the gate chose for it among its consumer's GPUs, as
        CUDA_VISIBLE_DEVICES writes it (None: as its command says). `cap`: the most its
        lease lets it take, as its runtime is told (`Memory.cap`), for a command the gate
        runs; a unit's command is its own (the drop-in carries its cap)."""

    @abc.abstractmethod
    async def stop(self) -> Exit | None:
        """Stop it and wait until it is gone; how it ended, when that is known."""

    @abc.abstractmethod
    async def is_running(self) -> bool:
        """Whether a process is there (and may hold memory)."""

    sleeps: ClassVar[bool] = False
    """Whether an eviction puts it to sleep (its context kept) rather than stopping it."""

    async def sleep(self) -> None:
        """Give its model's memory back and keep the process (a runtime that `sleeps`)."""
        raise ProcessControlError("this runtime cannot sleep: its memory goes when it stops")

    async def wake(self) -> None:
        """Take its model's memory again after `sleep`; returns once asked (see `wait_ready`)."""
        raise ProcessControlError("this runtime cannot be woken: it is started")

    async def probe(self) -> LifeReport:
        """What it is now: FOUND_UP, FOUND_ASLEEP or FOUND_STOPPED."""
        return LifeReport.FOUND_UP if await self.is_running() else LifeReport.FOUND_STOPPED

    def ended(self) -> asyncio.Future[Exit] | None:
        """A future that completes when the current process ends; None when not knowable."""
        return None

    def find(self) -> int | None:
        """A process running this runtime's own command that the control does not know."""
        return None

    def adopt(self, pid: int) -> None:
        """Take `pid` (found on the runtime's port or by its command) as the running
        process: `is_running` sees it and `stop` ends it."""
        raise ProcessControlError(f"this control cannot adopt process {pid}")
