"""A runtime run by systemd: started, stopped and read with `systemctl` (no D-Bus)."""

from __future__ import annotations

import asyncio
import contextlib
import enum
import shlex

from gpugate.runtimes.footprint import Cap
from gpugate.runtimes.process import Exit, ProcessControl, ProcessControlError, SystemctlError
from gpugate.runtimes.process_find import alive, stop_pid

SYSTEMCTL_TIMEOUT = 90.0
"""systemd's own default start/stop timeout (DefaultTimeoutStartSec)."""


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
