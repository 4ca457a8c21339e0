"""What the simulated Ollama exposes about itself to tests: runners and counters.

A real Ollama has none of this; it is served under /sim/state and by `SimOllama.state()`
so a test can assert "the upstream stopped generating" or "the runner is still loaded"
without guessing from timing.
"""

from __future__ import annotations

import enum
from datetime import datetime

import attrs

from gpugate_sim.ollama.options import RunnerOptions
from gpugate_sim.ollama.wire import rfc3339


class RunnerPhase(enum.Enum):
    LOADING = "loading"
    READY = "ready"
    UNLOADING = "unloading"
    GONE = "gone"


@attrs.define
class Counters:
    """Monotonic event counts, plus the requests being served right now."""

    loads: int = 0
    """Runners that finished loading."""
    load_failures: int = 0
    loads_aborted: int = 0
    """Loads whose request went away before the runner was ready (runner killed)."""
    unloads: int = 0
    oom_retries: int = 0
    """Loads tried again after a load ran out of memory (sched.go `load`)."""
    generations_started: int = 0
    generations_completed: int = 0
    generations_cancelled: int = 0
    """Generations stopped because the client went away."""
    generations_failed: int = 0
    """Generations ended by a simulated mid-stream error."""
    embeddings: int = 0
    requests_in_flight: int = 0

    def copy(self) -> Counters:
        return attrs.evolve(self)


@attrs.frozen
class RunnerInfo:
    """One runner as the scheduler sees it."""

    model: str
    pid: int | None
    phase: RunnerPhase
    size: int
    size_vram: int
    context_length: int
    refcount: int
    draining: bool
    """Chosen for eviction or reload: takes no new requests and unloads once idle."""
    options: RunnerOptions
    keep_alive: float | None
    """Seconds; None means forever."""
    expires_at: datetime | None
    """When an idle runner unloads (None while loading or for forever)."""
    vram_by_gpu: tuple[tuple[int, int], ...] = ()
    """(host GPU, bytes) for each GPU it was given; the bytes add up to `size_vram`."""

    def on(self, gpu: int) -> int:
        """Its bytes on host GPU `gpu`."""
        return sum(nbytes for index, nbytes in self.vram_by_gpu if index == gpu)

    def as_json(self) -> dict[str, object]:
        return {
            "model": self.model,
            "pid": self.pid,
            "phase": self.phase.value,
            "size": self.size,
            "size_vram": self.size_vram,
            "vram_by_gpu": {str(gpu): nbytes for gpu, nbytes in self.vram_by_gpu},
            "context_length": self.context_length,
            "refcount": self.refcount,
            "draining": self.draining,
            "options": self.options.as_json(),
            "keep_alive": self.keep_alive,
            "expires_at": None if self.expires_at is None else rfc3339(self.expires_at),
        }


@attrs.frozen
class SimState:
    """A snapshot of the scheduler."""

    runners: tuple[RunnerInfo, ...]
    counters: Counters
    pending: int
    """Requests waiting in the load queue (not yet taken by the scheduler)."""

    def runner(self, model: str) -> RunnerInfo | None:
        """The runner of a model by its display name ("llama3.2:latest"), if any."""
        for runner in self.runners:
            if runner.model == model:
                return runner
        return None

    def ready(self) -> tuple[RunnerInfo, ...]:
        return tuple(r for r in self.runners if r.phase is RunnerPhase.READY)

    def as_json(self) -> dict[str, object]:
        return {
            "runners": [r.as_json() for r in self.runners],
            "counters": attrs.asdict(self.counters),
            "pending": self.pending,
        }
