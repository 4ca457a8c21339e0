"""The server's side of a runner child process: spawn, wait for READY, kill."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import enum
import sys
from pathlib import Path

import attrs

from gpugate_sim.serverprocess import child_env, free_port

RUNNER_NAME = "llama-server"


class LoadOutcome(enum.Enum):
    READY = "ready"
    EXITED = "exited"
    ABANDONED = "abandoned"


@attrs.frozen
class RunnerCommand:
    """What a runner is started with; `argv()` is its full command line."""

    state_dir: Path
    shares: tuple[tuple[int, int], ...]
    """(host GPU, bytes) the runner holds on each GPU it was given, in its device order."""
    load_seconds: float
    blob_path: str
    num_ctx: int
    num_parallel: int
    num_batch: int
    gpu_layers: int
    main_gpu: int | None = None
    """Shown as `--split-mode none --main-gpu N`, as Ollama starts a runner it gave one GPU
    of several (or a main_gpu beyond its GPUs)."""
    fail: str | None = None
    """The load fails: this line on stderr, then exit status 1."""

    def argv(self, port: int) -> list[str]:
        argv = [
            sys.executable, "-m", "gpugate_sim.ollama.runner",
            "--state-dir", str(self.state_dir),
            "--load-seconds", repr(self.load_seconds),
            "--name", RUNNER_NAME,
        ]  # fmt: skip
        for gpu, nbytes in self.shares:
            argv += ["--share", f"{gpu}:{nbytes}"]
        if self.fail is not None:
            argv += ["--fail", self.fail]
        shown = []
        if self.main_gpu is not None:
            shown = ["--split-mode", "none", "--main-gpu", str(self.main_gpu)]
        return [
            *argv,
            "--",
            RUNNER_NAME,
            "--model", self.blob_path,
            "--port", str(port),
            "--ctx-size", str(self.num_ctx * self.num_parallel),
            "--batch-size", str(self.num_batch),
            "--n-gpu-layers", str(self.gpu_layers),
            "--parallel", str(self.num_parallel),
            *shown,
        ]  # fmt: skip


class RunnerProcess:
    """One live runner child."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self._proc = proc
        self._stderr_tail: collections.deque[str] = collections.deque(maxlen=20)
        self._stderr_task = asyncio.ensure_future(self._drain_stderr())

    @classmethod
    async def spawn(cls, command: RunnerCommand) -> RunnerProcess:
        """Start the child; it begins loading at once."""
        proc = await asyncio.create_subprocess_exec(
            *command.argv(free_port()),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=child_env(),
        )
        return cls(proc)

    @property
    def pid(self) -> int:
        return self._proc.pid

    @property
    def alive(self) -> bool:
        return self._proc.returncode is None

    async def _drain_stderr(self) -> None:
        assert self._proc.stderr is not None
        while line := await self._proc.stderr.readline():
            text = line.decode(errors="replace").strip()
            if text:
                self._stderr_tail.append(text)

    async def _ready_line(self) -> bool:
        assert self._proc.stdout is not None
        while line := await self._proc.stdout.readline():
            if line.startswith(b"READY"):
                return True
        return False

    async def wait_ready(self, abandoned: asyncio.Event) -> LoadOutcome:
        """Wait until the runner is loaded, has exited, or nobody wants it any more."""
        ready = asyncio.ensure_future(self._ready_line())
        gone = asyncio.ensure_future(abandoned.wait())
        try:
            await asyncio.wait({ready, gone}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (ready, gone):
                task.cancel()
        if ready.done() and not ready.cancelled() and ready.result():
            return LoadOutcome.READY
        if abandoned.is_set():
            return LoadOutcome.ABANDONED
        await self._proc.wait()
        return LoadOutcome.EXITED

    async def failure(self) -> str:
        """Why a runner that exited during its load did so, as Ollama words it."""
        await self._proc.wait()
        with contextlib.suppress(asyncio.CancelledError):
            await self._stderr_task
        if self._stderr_tail:
            return self._stderr_tail[-1]
        code = self._proc.returncode
        if code is not None and code < 0:
            return f"signal: {_signal_name(-code)}"
        return f"exit status {code}"

    async def kill(self) -> None:
        """SIGKILL and reap, as Ollama's unload does (Process.Kill, then Wait)."""
        if self._proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self._proc.kill()
        await self._proc.wait()
        self._stderr_task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._stderr_task


def _signal_name(number: int) -> str:
    names = {9: "killed", 6: "aborted", 11: "segmentation fault", 15: "terminated"}
    return names.get(number, f"signal {number}")
