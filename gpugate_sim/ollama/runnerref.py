"""A runner as the scheduler tracks it (Ollama's runnerRef), and scheduling errors."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Sequence
from datetime import datetime

import attrs

from gpugate_sim.ollama.catalog import CatalogModel
from gpugate_sim.ollama.duration import FOREVER, seconds
from gpugate_sim.ollama.options import RunnerOptions
from gpugate_sim.ollama.process import RunnerProcess
from gpugate_sim.ollama.state import RunnerInfo, RunnerPhase

MAX_QUEUE_MESSAGE = "server busy, please try again.  maximum pending requests exceeded"


class ScheduleError(Exception):
    """A request the scheduler could not serve; `status` is the HTTP status Ollama uses."""

    status = 500

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class QueueFull(ScheduleError):
    status = 503

    def __init__(self) -> None:
        super().__init__(MAX_QUEUE_MESSAGE)


class LoadFailed(ScheduleError):
    status = 500


@attrs.define(eq=False)
class Runner:
    """One runner: a model loaded (or loading) with fixed options in a child process."""

    model: CatalogModel
    options: RunnerOptions
    size: int
    size_vram: int
    context_length: int
    slots: asyncio.Semaphore
    keep_alive: int
    shares: tuple[tuple[int, int], ...] = ()
    """(host GPU, bytes) on each GPU it spans: what it reports per device once loaded, the
    bytes Ollama's `updateFreeSpace` counts as its own on that GPU."""
    process: RunnerProcess | None = None
    phase: RunnerPhase = RunnerPhase.LOADING
    refcount: int = 0
    expires_at: datetime | None = None
    draining: bool = False
    """Chosen for eviction or reload: takes no new requests, unloads once idle."""
    timer: asyncio.TimerHandle | None = None
    num_ctx_auto: bool = False
    """Started with Ollama's automatic context: a request with the automatic one is served
    whatever context that was (sched.go `needsReload`)."""
    idle: asyncio.Event = attrs.field(factory=asyncio.Event)
    gone: asyncio.Event = attrs.field(factory=asyncio.Event)

    @property
    def key(self) -> str:
        return self.model.name.key

    def serves(self, options: RunnerOptions, num_ctx_auto: bool = False) -> bool:
        """Whether a request with `options` can use this runner as it is."""
        if self.num_ctx_auto and num_ctx_auto:
            options = attrs.evolve(options, num_ctx=self.options.num_ctx)
        return (
            self.phase is RunnerPhase.READY
            and not self.draining
            and self.process is not None
            and self.process.alive
            and not self.options.needs_reload(options)
        )

    def cancel_timer(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def info(self) -> RunnerInfo:
        """The runner as /sim/state shows it."""
        return RunnerInfo(
            model=self.model.display,
            pid=None if self.process is None else self.process.pid,
            phase=self.phase,
            size=self.size,
            size_vram=self.size_vram,
            vram_by_gpu=self.shares,
            context_length=self.context_length,
            refcount=self.refcount,
            draining=self.draining,
            options=self.options,
            keep_alive=None if self.keep_alive >= FOREVER else seconds(self.keep_alive),
            expires_at=self.expires_at if self.refcount == 0 else None,
        )


@attrs.frozen
class Lease:
    """A request's hold on a runner, from scheduling until its response ends."""

    runner: Runner
    load_ns: int


_UINT64 = (1 << 64) - 1


def find_runner_to_unload(runners: Sequence[Runner]) -> Runner:
    """`findRunnerToUnload`: shortest keep_alive (compared as uint64, so forever is last)
    first, then model path; an idle runner first, else the first busy one."""
    ordered = sorted(runners, key=lambda r: (r.keep_alive & _UINT64, r.model.blob_path))
    for wanted in (
        lambda r: r.phase is RunnerPhase.READY and not r.draining and r.refcount == 0,
        lambda r: r.phase is RunnerPhase.READY and not r.draining,
    ):
        for runner in ordered:
            if wanted(runner):
                return runner
    return ordered[0]


def own_bytes(runners: Iterable[Runner]) -> dict[int, int]:
    """What runners hold on each GPU, added up (`updateFreeSpace`'s `predMap`)."""
    own: dict[int, int] = {}
    for runner in runners:
        for gpu, nbytes in runner.shares:
            own[gpu] = own.get(gpu, 0) + nbytes
    return own
