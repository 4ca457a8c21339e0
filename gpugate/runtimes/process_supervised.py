"""A runtime the gate runs as its own child: started, stopped by signals, reaped, watched."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import os
import signal
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from gpugate.runtimes.footprint import Cap
from gpugate.runtimes.process import Exit, ProcessControl, ProcessControlError
from gpugate.runtimes.process_find import alive, command_pids, watch_exit

STDERR_LINES = 20
"""How many of a child's last stderr lines an `Exit` keeps."""


def visible_devices(devices: str) -> dict[str, str]:
    """The environment that shows a CUDA program only `devices` (a GPU's UUID, or its
    index). CUDA numbers GPUs fastest first unless told PCI bus order, and NVML (the gate's
    numbers) counts in bus order: an index is only meant that way with CUDA_DEVICE_ORDER."""
    return {"CUDA_VISIBLE_DEVICES": devices, "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}


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
