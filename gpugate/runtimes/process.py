"""Starting and stopping a runtime that holds its model for its whole life (whisper-server).

Such a runtime frees its VRAM only by exiting, so the gate controls it as a process:

* `SystemdUnit(unit)`: `systemctl start|stop|is-active UNIT`, each bounded by a timeout,
  when the runtime is a systemd service (its ExecStartPre may run `gpugate admit`).
* `SupervisedCommand(argv, env, cwd)`: the gate runs the command itself as its child, stops
  it with SIGTERM then SIGKILL after a grace, reaps it, and reports how it ended (status,
  signal, the last lines of its stderr), including when it died on its own.

A process found running (`process_find.py`) is adopted: `adopt(pid)`. Waiting for a
started one to answer is `process_ready.wait_ready`.

Nothing here knows the gate: it is asyncio and subprocesses only.
"""

from __future__ import annotations

import abc
import asyncio
import collections
import contextlib
import enum
import os
import shlex
import signal
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import ClassVar

import attrs

from gpugate.core.lifecycle import LifeReport
from gpugate.runtimes.footprint import Cap
from gpugate.runtimes.process_find import alive, command_pids, stop_pid, watch_exit

STDERR_LINES = 20
"""How many of a child's last stderr lines an `Exit` keeps."""
SYSTEMCTL_TIMEOUT = 90.0
"""systemd's own default start/stop timeout (DefaultTimeoutStartSec)."""


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


class UnitState(enum.Enum):
    """What `systemctl is-active` prints."""

    ACTIVE = "active"
    RELOADING = "reloading"
    INACTIVE = "inactive"
    FAILED = "failed"
    ACTIVATING = "activating"
    DEACTIVATING = "deactivating"
    MAINTENANCE = "maintenance"
    REFRESHING = "refreshing"

    @property
    def running(self) -> bool:
        """Whether the unit has (or is getting) a live process that may hold memory."""
        return self in (UnitState.ACTIVE, UnitState.RELOADING, UnitState.ACTIVATING,
                        UnitState.DEACTIVATING, UnitState.REFRESHING)  # fmt: skip


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


class SystemdUnit(ProcessControl):
    """A runtime run by systemd, controlled with `systemctl` (no D-Bus)."""

    def __init__(
        self,
        unit: str,
        *,
        start_timeout: float = SYSTEMCTL_TIMEOUT,
        stop_timeout: float = SYSTEMCTL_TIMEOUT,
        query_timeout: float = 10.0,
        systemctl: str = "systemctl",
    ) -> None:
        self.unit = unit
        self.start_timeout = start_timeout
        self.stop_timeout = stop_timeout
        self.query_timeout = query_timeout
        self.systemctl = systemctl
        self._foreign: int | None = None

    def adopt(self, pid: int) -> None:
        """A process outside the unit (started by hand) serves the runtime's port: it is
        counted as running, and stopped by signal with the unit."""
        self._foreign = pid

    async def start(self, devices: str | None = None, cap: Cap | None = None) -> None:
        """`systemctl start UNIT`: waits for the start job (ExecStartPre included). A
        unit's GPU is its own Environment= (the configuration gives such a consumer one),
        and its cap is its own command's (`gpugate init` writes it into the drop-in)."""
        if devices is not None:
            raise ProcessControlError(
                f"{self.unit}: a unit's GPU is its own Environment=CUDA_VISIBLE_DEVICES"
            )
        await self._run("start", self.start_timeout)

    async def stop(self) -> Exit | None:
        """`systemctl stop UNIT`: waits until its processes are gone (systemd's own SIGKILL
        after its TimeoutStopSec included). How it ended is systemd's to record."""
        await self._run("stop", self.stop_timeout)
        pid, self._foreign = self._foreign, None
        if pid is not None:
            await stop_pid(pid, self.stop_timeout)
        return None

    async def state(self) -> UnitState:
        """`systemctl is-active UNIT` (its non-zero status for "inactive" is not an error)."""
        code, out, err = await self._call("is-active", self.query_timeout)
        word = out.strip().splitlines()[-1] if out.strip() else ""
        try:
            return UnitState(word)
        except ValueError:
            raise SystemctlError(
                f"systemctl is-active {self.unit} answered {word!r}", stderr=err, returncode=code
            ) from None

    async def command(self) -> list[str] | None:
        """The unit's main command line as systemd will run it (drop-ins applied):
        `systemctl show --property=ExecStart --value UNIT`. None when it cannot be read."""
        code, out, _ = await self._call(
            "show", self.query_timeout, "--property=ExecStart", "--value"
        )
        return exec_start_argv(out) if code == 0 else None

    async def is_running(self) -> bool:
        if self._foreign is not None and alive(self._foreign):
            return True
        self._foreign = None
        return (await self.state()).running

    async def _run(self, verb: str, timeout: float) -> None:
        code, _, err = await self._call(verb, timeout)
        if code != 0:
            raise SystemctlError(
                f"systemctl {verb} {self.unit} failed with status {code}",
                stderr=err,
                returncode=code,
            )

    async def _call(self, verb: str, timeout: float, *options: str) -> tuple[int, str, str]:
        argv = [self.systemctl, verb, *options, self.unit]
        try:
            process = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
            )
        except OSError as exc:
            raise SystemctlError(f"cannot run {self.systemctl}: {exc.strerror}") from None
        try:
            async with asyncio.timeout(timeout):
                out, err = await process.communicate()
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            await process.wait()
            # The job may still run in systemd; only the wait for it was given up.
            raise SystemctlError(
                f"systemctl {verb} {self.unit} did not finish within {timeout:g}s"
            ) from None
        assert process.returncode is not None
        return process.returncode, out.decode(errors="replace"), err.decode(errors="replace")


def visible_devices(devices: str) -> dict[str, str]:
    """The environment that shows a CUDA program only `devices` (a GPU's UUID, or its
    index). CUDA numbers GPUs fastest first unless told PCI bus order, and NVML (the gate's
    numbers) counts in bus order: an index is only meant that way with CUDA_DEVICE_ORDER."""
    return {"CUDA_VISIBLE_DEVICES": devices, "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}


def exec_start_argv(shown: str) -> list[str] | None:
    """The argv of the first command in systemd's ExecStart property
    (`{ path=... ; argv[]=/usr/bin/whisper-server -m x.bin ; ignore_errors=no ; ... }`)."""
    start = shown.find("argv[]=")
    if start < 0:
        return None
    words = shown[start + len("argv[]=") :].split(" ; ", 1)[0]
    try:
        return shlex.split(words) or None
    except ValueError:
        return words.split() or None


class SupervisedCommand(ProcessControl):
    """A runtime the gate runs as its own child.

    `on_exit` is called (on the event loop) when the child ends on its own, not when
    `stop()` ended it: a crash, an OOM abort, an exit after a failed load.
    """

    def __init__(
        self,
        argv: Sequence[str],
        env: Mapping[str, str] | None = None,
        cwd: Path | str | None = None,
        *,
        stop_grace: float = 10.0,
        on_exit: Callable[[Exit], None] | None = None,
        stderr_lines: int = STDERR_LINES,
    ) -> None:
        if not argv:
            raise ValueError("a command needs at least the program to run")
        self.argv = list(argv)
        self.env = dict(env) if env is not None else None
        self.cwd = cwd
        self.stop_grace = stop_grace
        self.on_exit = on_exit
        self.last_exit: Exit | None = None
        self._stderr: collections.deque[str] = collections.deque(maxlen=stderr_lines)
        self._process: asyncio.subprocess.Process | None = None
        self._ended: asyncio.Future[Exit] | None = None
        self._waiter: asyncio.Task[None] | None = None
        self._stopping = False
        self._adopted: int | None = None
        self.started: tuple[str, ...] = tuple(self.argv)
        """The command line of the last start: `argv` and the cap it was told."""
        self.kept: str | None = None
        """How `argv` or `env` set the knob of the last start's cap themselves (kept)."""

    @property
    def pid(self) -> int | None:
        """The running process's PID (None when none runs)."""
        if not self.running:
            return None
        return self._adopted if self._process is None else self._process.pid

    @property
    def adopted(self) -> bool:
        """Whether the running process is one the gate found rather than started."""
        return self.running and self._process is None

    def find(self) -> int | None:
        """A process running this very command that is not the gate's child (left by an
        earlier gate, or started by hand), if there is one."""
        mine = self._process.pid if self._process is not None and self.running else None
        found = [pid for pid in command_pids(self.argv, told=True) if pid != mine]
        return found[0] if found else None

    def adopt(self, pid: int) -> None:
        """Take `pid` as the running process: stopped by signals, its end watched."""
        if self.running:
            raise ProcessControlError(f"{self.argv[0]} is already running (pid {self.pid})")
        self._process = None
        self._adopted = pid
        self._stopping = False
        self._stderr.clear()
        self._ended = asyncio.get_running_loop().create_future()
        self._waiter = asyncio.create_task(
            self._wait_adopted(pid, self._ended), name=f"supervise-{pid}"
        )

    async def _wait_adopted(self, pid: int, ended: asyncio.Future[Exit]) -> None:
        await watch_exit(pid)
        self._finish(ended, Exit(None, (), stopped=self._stopping))

    @property
    def running(self) -> bool:
        return self._ended is not None and not self._ended.done()

    async def start(self, devices: str | None = None, cap: Cap | None = None) -> None:
        """Run the command (on `devices`: CUDA_VISIBLE_DEVICES), told `cap` unless the
        command or its environment sets that knob (`Cap.onto`: the operator's value is
        kept); ProcessControlError when it cannot be run or already runs."""
        if self.running:
            raise ProcessControlError(f"{self.argv[0]} is already running (pid {self.pid})")
        env = None if self.env is None else {**os.environ, **self.env}
        if devices is not None:
            env = {**(os.environ if env is None else env), **visible_devices(devices)}
        argv = tuple(self.argv)
        self.kept = None
        if cap is not None:
            capped = cap.onto(argv, os.environ if env is None else env)
            argv, self.kept = capped.argv, capped.kept
            if capped.env:
                env = {**(os.environ if env is None else env), **capped.env}
        self.started = argv
        self._stderr.clear()
        self._stopping = False
        try:
            self._process = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.PIPE,
                env=env,
                cwd=self.cwd,
                # Its own process group: a wrapper script's children are stopped with it.
                start_new_session=True,
            )
        except OSError as exc:
            raise ProcessControlError(f"cannot run {self.argv[0]}: {exc.strerror or exc}") from None
        self._adopted = None
        self._ended = asyncio.get_running_loop().create_future()
        self._waiter = asyncio.create_task(
            self._wait(self._process, self._ended), name=f"supervise-{self._process.pid}"
        )

    def ended(self) -> asyncio.Future[Exit] | None:
        return self._ended

    async def is_running(self) -> bool:
        return self.running

    async def stop(self, grace: float | None = None) -> Exit | None:
        """SIGTERM, then SIGKILL after `grace` (default: stop_grace); the reaped exit.

        The last exit when nothing runs; None when nothing was ever started.
        """
        if self._ended is None or (self._process is None and self._adopted is None):
            return None
        if not self._ended.done():
            self._stopping = True
            self._signal(signal.SIGTERM)
            try:
                async with asyncio.timeout(self.stop_grace if grace is None else grace):
                    await asyncio.shield(self._ended)
            except TimeoutError:
                self._signal(signal.SIGKILL)
        return await asyncio.shield(self._ended)

    def _signal(self, signum: int) -> None:
        if self._process is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self._process.pid, signum)
            return
        pid = self._adopted
        if pid is None or not alive(pid):
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            # Started in a session of its own (as the gate starts it): its group goes too.
            if os.getpgid(pid) == pid:
                os.killpg(pid, signum)
            else:
                os.kill(pid, signum)

    async def _wait(self, process: asyncio.subprocess.Process, ended: asyncio.Future[Exit]) -> None:
        assert process.stderr is not None
        reader = asyncio.create_task(self._read(process.stderr))
        code = await process.wait()
        if not self._stopping:
            # Whatever it left in its group (a wrapper's children) goes with it.
            self._signal(signal.SIGKILL)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(1.0):
                await asyncio.shield(reader)
        reader.cancel()
        self._finish(ended, Exit(code, tuple(self._stderr), stopped=self._stopping))

    def _finish(self, ended: asyncio.Future[Exit], exit: Exit) -> None:
        self.last_exit = exit
        if not ended.done():
            ended.set_result(exit)
        if not exit.stopped and self.on_exit is not None:
            self.on_exit(exit)

    async def _read(self, stream: asyncio.StreamReader) -> None:
        try:
            async for raw in stream:
                self._stderr.append(raw.decode(errors="replace").rstrip("\r\n"))
        except (OSError, ValueError):
            pass  # an over-long line or a closed pipe: the exit status still matters
