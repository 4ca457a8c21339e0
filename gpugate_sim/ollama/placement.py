"""Which of its GPUs Ollama gives a model, and how much of each GPU it counts as available.

Ollama's scheduler (server/sched.go at v0.33.0-rc2, fb30760) picks the GPUs before it starts
a llama-server runner:

* `updateFreeSpace`: a GPU's available memory is the smaller of what the driver reports free
  and its total less what Ollama's own loaded runners use there (`ollama_view`).
* `selectLlamaServerPlacement`: one GPU, or `num_gpu: 0`, leaves the list as it is; an
  explicit `main_gpu` that indexes the list takes that one GPU; else, unless
  OLLAMA_SCHED_SPREAD, the one GPU whose available memory holds the predicted size within
  80 % (the most available wins, the first among equals); else every GPU (`select`).
* `availableMemoryForPlacement`: the memory a load is weighed against is the chosen GPUs'
  available memory added up (`available`).

How the runner then lays the model over the chosen GPUs is llama-server's business:
gpugate_sim.ollama.layout.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import attrs

from gpugate_sim.statefile import HostState

SINGLE_GPU_FIT_PERCENT = 80
"""bestSingleGPUFit: a model fits one GPU when it needs at most 80 % of its available memory."""


@attrs.frozen
class GpuMemory:
    """One GPU as Ollama's scheduler reads it."""

    index: int
    """The host GPU (its NVML index)."""
    total: int
    free: int
    """Bytes available: the driver's free memory, or Ollama's view of it (`ollama_view`)."""


@attrs.frozen
class Placement:
    """The GPUs a runner is started on, in Ollama's device order."""

    gpus: tuple[int, ...]
    main_gpu: int | None = None
    """What the runner is told with `--split-mode none --main-gpu N` (None: neither flag).
    A single GPU chosen among several gets 0: the runner then sees only that one."""

    @property
    def split(self) -> bool:
        """True when the model's layers are divided over more than one GPU."""
        return len(self.gpus) > 1 and self.main_gpu is None


def ollama_view(gpus: Sequence[GpuMemory], own: Mapping[int, int]) -> tuple[GpuMemory, ...]:
    """`updateFreeSpace`: each GPU's free memory as Ollama counts it.

    `own` is what Ollama's loaded runners use on each GPU (the bytes each runner reported
    per device). Ollama takes the smaller of the driver's free memory and total less its own
    runners': the driver's figure may lag an unload, and another program may have grown.
    With nothing loaded the driver's figure stands.
    """
    if not own:
        return tuple(gpus)
    seen = []
    for gpu in gpus:
        used = own.get(gpu.index, 0)
        # Own use above the total ("predicted usage exceeds VRAM") leaves nothing.
        free = 0 if used > gpu.total else min(gpu.free, gpu.total - used)
        seen.append(attrs.evolve(gpu, free=free))
    return tuple(seen)


def select(
    gpus: Sequence[GpuMemory],
    predicted: int,
    *,
    num_gpu: int,
    main_gpu: int | None,
    spread: bool,
) -> Placement:
    """`selectLlamaServerPlacement` for GPUs of one library (every simulated GPU is CUDA).

    `gpus` are the GPUs Ollama sees with their available memory, in its order; `predicted`
    the model's predicted size. `num_gpu: 0` gets no GPU at all (`processPending` hands
    such a load an empty list).
    """
    if num_gpu == 0:
        return Placement(())
    everything = Placement(tuple(g.index for g in gpus))
    if len(gpus) <= 1:
        # The list as it is; a main_gpu the client gave is not acted on here (see
        # docs/runtimes/ollama.md: on one GPU the simulator ignores main_gpu).
        return everything
    if main_gpu is not None:
        # bestExplicitMainGPU: an index of this list, else the whole group with main_gpu
        # passed on to llama-server as given.
        if 0 <= main_gpu < len(gpus):
            return Placement((gpus[main_gpu].index,), main_gpu=0)
        return attrs.evolve(everything, main_gpu=main_gpu)
    if not spread and predicted > 0:
        best = _best_single_fit(gpus, predicted)
        if best is not None:
            return Placement((best.index,), main_gpu=0)
    return everything


def _best_single_fit(gpus: Sequence[GpuMemory], predicted: int) -> GpuMemory | None:
    """`bestSingleGPUFit`: the GPU with the most available memory among those the model
    fits in 80 % of; a later GPU must have strictly more to win (`betterPlacementGPU`)."""
    best: GpuMemory | None = None
    for gpu in gpus:
        # Go's uint64 arithmetic: available*80/100, rounded down.
        if predicted > gpu.free * SINGLE_GPU_FIT_PERCENT // 100:
            continue
        if best is None or gpu.free > best.free:
            best = gpu
    return best


def available(placement: Placement, view: Sequence[GpuMemory]) -> int:
    """`availableMemoryForPlacement`: the chosen GPUs' available memory, added up."""
    chosen = set(placement.gpus)
    return sum(g.free for g in view if g.index in chosen)


@attrs.frozen
class LoadPlan:
    """Where a load goes, read from the device state at the moment it is decided."""

    placement: Placement
    available: int
    """What the load is weighed against before it may start without an eviction."""
    runner_gpus: tuple[int, ...]
    """The GPUs llama-server puts layers on (`--split-mode none` keeps only `--main-gpu`)."""
    runner_free: tuple[int, ...]
    """Their free memory as the driver reports it: llama-server splits by this."""
    error: str | None = None
    """llama.cpp's refusal of the placement (a `main_gpu` beyond the runner's GPUs)."""


def plan_load(
    state: HostState,
    devices: Sequence[int],
    own: Mapping[int, int],
    predicted: int,
    *,
    num_gpu: int,
    main_gpu: int | None,
    spread: bool,
) -> LoadPlan:
    """Place a load of `predicted` bytes on the GPUs Ollama sees (`devices`), given what
    its loaded runners use on each (`own`)."""
    driver = [GpuMemory(i, state.device(i).total, state.free(i)) for i in devices]
    view = ollama_view(driver, own)
    placement = select(view, predicted, num_gpu=num_gpu, main_gpu=main_gpu, spread=spread)
    gpus, error = placement.gpus, None
    if placement.main_gpu is not None:
        # llama.cpp `llama_model_load_from_file_impl`: with --split-mode none only the
        # main GPU stays; a negative one leaves none (all on the CPU), one beyond the list
        # fails the load.
        if placement.main_gpu < 0:
            gpus = ()
        elif placement.main_gpu < len(gpus):
            gpus = (gpus[placement.main_gpu],)
        else:
            error = (
                f"llama_model_load_from_file_impl: invalid value for main_gpu: "
                f"{placement.main_gpu} (available devices: {len(gpus)})"
            )
    free = {g.index: g.free for g in driver}
    return LoadPlan(
        placement=placement,
        available=available(placement, view),
        runner_gpus=gpus,
        runner_free=tuple(free[i] for i in gpus),
        error=error,
    )
