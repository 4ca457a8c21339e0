"""Simulated GPU device state, shared between processes through one small text file.

The file is the fake NVML library's only input (it re-reads it on every call), and
every simulated process that "holds VRAM" writes its allocation into it under an
exclusive lock. Capacity is enforced as the driver would: an allocation that does not
fit fails with `GpuOutOfMemory` and is recorded as an OOM event. Allocations of dead
PIDs vanish, as the driver reclaims a context when its process exits.

The file's format and its parser are in gpugate_sim.statefile.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import attrs

from gpugate_sim.statefile import (
    HostState,
    SimDevice,
    SimFailure,
    SimProcess,
    SimStall,
)

__all__ = [
    "GpuOutOfMemory",
    "HostState",
    "OomEvent",
    "SimDevice",
    "SimFailure",
    "SimProcess",
    "SimStall",
    "SimulatedGpuHost",
    "pid_alive",
]

STATE_FILE = "nvml.state"
LOCK_FILE = "nvml.lock"
EVENTS_FILE = "events.jsonl"


class GpuOutOfMemory(Exception):
    """An allocation did not fit: what cudaMalloc reports as out of memory."""

    def __init__(self, gpu: int, pid: int, requested: int, free: int) -> None:
        super().__init__(
            f"CUDA error: out of memory (GPU {gpu}: pid {pid} asked for {requested} bytes, "
            f"{free} free)"
        )
        self.gpu = gpu
        self.pid = pid
        self.requested = requested
        self.free = free


@attrs.frozen
class OomEvent:
    time: float
    gpu: int
    pid: int
    name: str
    requested: int
    free: int


def pid_alive(pid: int) -> bool:
    """True while the process exists and is not a zombie (the driver frees at exit)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read()
    except (FileNotFoundError, ProcessLookupError):
        return False
    state = stat[stat.rfind(b")") + 2 : stat.rfind(b")") + 3]
    return state not in (b"Z", b"X")


class SimulatedGpuHost:
    """Read and change the shared device state of a simulated host (any process may)."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = Path(directory)
        self.state_path = self.directory / STATE_FILE
        self.lock_path = self.directory / LOCK_FILE
        self.events_path = self.directory / EVENTS_FILE

    @classmethod
    def create(
        cls,
        directory: str | os.PathLike[str],
        devices: list[SimDevice],
        *,
        driver: str = "550.54.15",
        cuda: int = 12040,
        check_pids: bool = True,
    ) -> SimulatedGpuHost:
        """Write a fresh state file with these devices and no processes."""
        host = cls(directory)
        host.directory.mkdir(parents=True, exist_ok=True)
        state = HostState(devices=list(devices), driver=driver, cuda=cuda, check_pids=check_pids)
        with host._lock():
            host._write(state)
        host.events_path.write_text("")
        return host

    # -- reading -----------------------------------------------------------------------

    def read(self) -> HostState:
        """The current state, without allocations of processes that have exited."""
        state = HostState.parse(self.state_path.read_text())
        if state.check_pids:
            state.processes = [p for p in state.processes if pid_alive(p.pid)]
        return state

    def free(self, gpu: int = 0) -> int:
        return self.read().free(gpu)

    def ooms(self) -> list[OomEvent]:
        """Every allocation that did not fit, oldest first."""
        if not self.events_path.exists():
            return []
        events = []
        for line in self.events_path.read_text().splitlines():
            record = json.loads(line)
            if record.pop("event", None) == "oom":
                events.append(OomEvent(**record))
        return events

    # -- changing ----------------------------------------------------------------------

    def allocate(
        self, pid: int, nbytes: int, *, gpu: int = 0, kind: str = "C", name: str = ""
    ) -> int:
        """Add `nbytes` to what `pid` holds on `gpu`; returns its new total.

        Raises GpuOutOfMemory (and records an OOM event) when it does not fit.
        """
        if nbytes < 0:
            raise ValueError("allocate() takes a non-negative byte count; use release()")
        with self._edit() as state:
            free = state.free(gpu)
            if nbytes > free:
                self._record_oom(OomEvent(time.time(), gpu, pid, name, nbytes, free))
                raise GpuOutOfMemory(gpu, pid, nbytes, free)
            held = state.held_by(pid, gpu) + nbytes
            others = [p for p in state.processes if not (p.pid == pid and p.gpu == gpu)]
            previous = [p for p in state.processes if p.pid == pid and p.gpu == gpu]
            kind = previous[0].kind if previous else kind
            name = name or (previous[0].name if previous else "")
            state.processes = [*others, SimProcess(gpu, pid, held, kind, name)]
            return held

    def release(self, pid: int, nbytes: int | None = None, *, gpu: int | None = None) -> int:
        """Give back `nbytes` (all when None) held by `pid`; returns what it still holds."""
        with self._edit() as state:
            remaining = 0
            kept = []
            for p in state.processes:
                if p.pid != pid or (gpu is not None and p.gpu != gpu):
                    kept.append(p)
                    continue
                if nbytes is None:
                    continue
                left = max(0, p.used - nbytes)
                remaining += left
                if left:
                    kept.append(attrs.evolve(p, used=left))
            state.processes = kept
            return remaining

    def transfer(self, source: int, target: int) -> int:
        """Move what `source` holds (every GPU) to `target`; returns the bytes moved."""
        with self._edit() as state:
            moved = 0
            kept = []
            for p in state.processes:
                if p.pid != source:
                    kept.append(p)
                    continue
                moved += p.used
                own = [q for q in kept if q.pid == target and q.gpu == p.gpu]
                if own:
                    kept[kept.index(own[0])] = attrs.evolve(own[0], used=own[0].used + p.used)
                else:
                    kept.append(attrs.evolve(p, pid=target))
            state.processes = kept
            return moved

    def add_process(self, process: SimProcess) -> None:
        """Place a process row as is (no capacity check): for scenarios and tests."""
        with self._edit() as state:
            state.device(process.gpu)
            state.processes.append(process)

    def set_base_used(self, gpu: int, nbytes: int) -> None:
        with self._edit() as state:
            state.devices = [
                attrs.evolve(d, base_used=nbytes) if d.index == gpu else d for d in state.devices
            ]

    def inject(self, symbol: str, code: int, gpu: int | None = None) -> None:
        """Make an NVML symbol fail with an NVML error code."""
        with self._edit() as state:
            state.failures.append(SimFailure(symbol, code, gpu))

    def stall(self, symbol: str, milliseconds: int, gpu: int | None = None) -> None:
        """Make an NVML symbol block for a while before it answers."""
        with self._edit() as state:
            state.stalls.append(SimStall(symbol, milliseconds, gpu))

    def lose(self, gpu: int | None = None) -> None:
        """The GPU falls off the bus: GPU_IS_LOST until it is back and NVML re-initialised."""
        with self._edit() as state:
            state.lost.append(gpu)

    def clear_injections(self) -> None:
        with self._edit() as state:
            state.failures = []
            state.stalls = []
            state.lost = []
            state.init_error = 0

    def set_init_error(self, code: int) -> None:
        with self._edit() as state:
            state.init_error = code

    # -- internals ---------------------------------------------------------------------

    @contextlib.contextmanager
    def _lock(self) -> Iterator[None]:
        self.directory.mkdir(parents=True, exist_ok=True)
        with open(self.lock_path, "a+") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)

    @contextlib.contextmanager
    def _edit(self) -> Iterator[HostState]:
        with self._lock():
            state = self.read()
            yield state
            self._write(state)

    def _write(self, state: HostState) -> None:
        # Atomic replace: the C library may read at any moment and must see a whole file.
        fd, tmp = tempfile.mkstemp(dir=self.directory, prefix=".nvml.", suffix=".tmp")
        try:
            with os.fdopen(fd, "w") as fh:
                fh.write(state.render())
            os.replace(tmp, self.state_path)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise

    def _record_oom(self, event: OomEvent) -> None:
        with open(self.events_path, "a") as fh:
            fh.write(json.dumps({"event": "oom", **attrs.asdict(event)}) + "\n")
