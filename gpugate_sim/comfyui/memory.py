"""ComfyUI's model management, reduced to VRAM: what its one process holds on the card.

Everything is allocated on the simulated device under the ComfyUI process's PID: the CUDA
context at start, a model's weights when a node first needs them on the GPU
(`load_models_gpu`: loader nodes only read files), a sampler's working set while it
runs. Weights stay after the prompt (smart memory) until a load needs the room, `/free`
unloads them, or the node cache that referenced them drops them. An allocation the card
cannot hold raises `TorchOutOfMemory` with PyTorch's words.

How much of a model goes onto the card follows comfy/model_management.py of ComfyUI 0.3.64
(a125cd8), the version the simulator answers as:

* `--reserve-vram GB` sets `EXTRA_RESERVED_VRAM` to GB × 1024³ (400 MiB on Linux without
  it); `minimum_inference_memory()` is 0.8 GiB plus that reserve.
* `load_models_gpu(models, memory_required, minimum_memory_required)` first frees other
  models until `1.1 × the missing weights + max(minimum_inference_memory, memory_required
  + reserve)` is free, and again until `max(minimum_inference_memory, minimum_memory_required
  + reserve)` is (`free_memory`: with smart memory a model is only partly unloaded when
  that is enough, `LoadedModel.model_unload(memory_to_free)`).
* Then each model is loaded in NORMAL_VRAM partially (lowvram): `lowvram_model_memory =
  max(128 MiB, free + its loaded bytes - minimum_memory_required)` (MIN_WEIGHT_MEMORY_RATIO
  is 0 on NVIDIA), less what it already has there; the weights beyond it stay in CPU RAM
  and are copied to the GPU for every use (comfy/ops.py `cast_bias_weight`). So a model
  loads whole when it fits, partly when it does not, and an allocation fails only when not
  even 128 MiB of it, or the sampler's working set beside it, fits: ComfyUI's own minimum.

Dynamic VRAM (ComfyUI PR #11845; comfy-aimdo, Comfy-Org/comfy-aimdo ce3c59e), when on,
replaces the estimate: weights fault into VRAM as they are used while the card keeps
`VRAM_HEADROOM` (256 MiB, src/plat.h) plus `--vram-headroom GB` free, counting every
process's memory, and while the process's own use stays below the card's total less the
"simple" headroom (`--reserve-vram` when given, else 256 MiB; main.py passes it as
`simple_vram_headroom`). `budget_deficit` (src/plat.h) is checked before every allocation
and on every weight fault (src/model-vbar.c `vbar_fault`), and a deficit is paid by evicting
resident weights (`vbars_free`), least recently used model first; the free memory it
compares against is polled from the driver (cuMemGetInfo, or NVML since ComfyUI's
`--disable-nvml-pressure` PR #15215). The simulator checks it at every load and every
sampler step.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterable

import attrs

from gpugate.core.units import GiB, MiB
from gpugate_sim.device import GpuOutOfMemory, SimulatedGpuHost

LOAD_STEPS = 4
EXTRA_RESERVED_VRAM = 400 * MiB
"""comfy/model_management.py `EXTRA_RESERVED_VRAM` on Linux, without --reserve-vram."""
INFERENCE_MEMORY = int(0.8 * GiB)
"""`minimum_inference_memory()` less the reserve."""
LOWVRAM_FLOOR = 128 * MiB
"""The least `lowvram_model_memory` of 0.3.64's `load_models_gpu`."""
FREE_MARGIN = 1.1
"""`free_memory(total_memory_required * 1.1 + extra_mem)`."""
DYNAMIC_HEADROOM = 256 * MiB
"""comfy-aimdo's `VRAM_HEADROOM` (src/plat.h): free memory it always leaves on the card."""
ALLOCATION_HEADROOM = 128 * MiB
"""comfy-aimdo's `CUDA_MALLOC_HEADROOM` (src/pyt-cu-plug-alloc-async.c): what an
allocation makes room for beyond its own size."""


@attrs.frozen
class Part:
    """Weights from one file with one role (a checkpoint holds model, clip and vae parts)."""

    folder: str
    name: str
    role: str
    size: int


@attrs.frozen
class MemoryOptions:
    """ComfyUI's command-line options that decide how it uses the card."""

    reserve: int = EXTRA_RESERVED_VRAM
    """`EXTRA_RESERVED_VRAM`: `--reserve-vram GB` × 1024³, else 400 MiB."""
    reserve_given: bool = False
    """Whether `--reserve-vram` was given (Dynamic VRAM's simple headroom is then it)."""
    dynamic: bool = False
    """Dynamic VRAM on (`--enable-dynamic-vram`)."""
    headroom: int = 0
    """`--vram-headroom GB` × 1024³: Dynamic VRAM's extra free memory."""
    smart_memory: bool = True
    """False with `--disable-smart-memory`: `free_memory` unloads every other model."""

    @property
    def minimum_inference(self) -> int:
        """`minimum_inference_memory()`."""
        return INFERENCE_MEMORY + self.reserve

    @property
    def simple_headroom(self) -> int:
        """comfy-aimdo's `simple_vram_headroom`: --reserve-vram when given, else 256 MiB."""
        return self.reserve if self.reserve_given else DYNAMIC_HEADROOM


def reserve_bytes(reserve_vram: float | None) -> int:
    """`EXTRA_RESERVED_VRAM` for `--reserve-vram` (GB, × 1024³; None: Linux's 400 MiB)."""
    return EXTRA_RESERVED_VRAM if reserve_vram is None else int(reserve_vram * GiB)


class TorchOutOfMemory(Exception):
    """torch.OutOfMemoryError: what a failed CUDA allocation raises in PyTorch."""


TorchOutOfMemory.__module__ = "torch"
TorchOutOfMemory.__qualname__ = TorchOutOfMemory.__name__ = "OutOfMemoryError"


def format_size(size: int) -> str:
    """PyTorch's `format_size` of the caching allocator's messages."""
    if size <= 1024:
        return f"{size} bytes"
    if size <= 1048576:
        return f"{size / 1024:.2f} KiB"
    if size <= 1073741824:
        return f"{size / 1048576:.2f} MiB"
    return f"{size / 1073741824:.2f} GiB"


class Vram:
    """The ComfyUI process's memory on one simulated GPU."""

    def __init__(
        self,
        gpu: SimulatedGpuHost,
        index: int,
        pid: int,
        *,
        load_seconds_per_gib: float = 0.0,
        options: MemoryOptions | None = None,
    ) -> None:
        self.gpu = gpu
        self.index = index
        self.pid = pid
        self.load_seconds_per_gib = load_seconds_per_gib
        self.options = options or MemoryOptions()
        self.loaded: dict[Part, int] = {}
        """Weights with bytes on the GPU, least recently used first: how many of each."""
        self.working = 0
        self.context = 0

    @property
    def torch_reserved(self) -> int:
        """What PyTorch's allocator holds: weights and working sets, not the context."""
        return sum(self.loaded.values()) + self.working

    def offloaded(self, parts: Iterable[Part]) -> int:
        """Bytes of `parts` not on the GPU: kept in CPU RAM and copied over for each use."""
        return sum(part.size - self.loaded.get(part, 0) for part in dict.fromkeys(parts))

    def create_context(self, nbytes: int) -> None:
        """Hold the CUDA context, as a process does from its first CUDA call to its exit."""
        self._allocate(nbytes, "context")
        self.context = nbytes

    async def load(
        self,
        parts: Iterable[Part],
        memory_required: int = 0,
        minimum_memory_required: int | None = None,
    ) -> None:
        """`load_models_gpu`: bring `parts` onto the GPU, whole where they fit, else as much
        of them as leaves `minimum_memory_required` (and the reserve) free."""
        wanted = list(dict.fromkeys(parts))
        for part in wanted:
            if part in self.loaded:
                self.loaded[part] = self.loaded.pop(part)
        keep = set(wanted)
        if self.options.dynamic:
            for part in wanted:
                self._relieve(-self._dynamic_room(), keep)
                room = max(0, self._dynamic_room())
                have = self.loaded.get(part, 0)
                await self._load_to(part, min(part.size, have + room))
            return
        options = self.options
        extra = max(options.minimum_inference, memory_required + options.reserve)
        minimum = (
            extra
            if minimum_memory_required is None
            else max(options.minimum_inference, minimum_memory_required + options.reserve)
        )
        self.free_for(int(self.offloaded(wanted) * FREE_MARGIN) + extra, keep)
        if self.gpu.free(self.index) < minimum:
            self.free_for(minimum, keep)
        for part in wanted:
            have = self.loaded.get(part, 0)
            if have >= part.size:
                continue
            budget = max(LOWVRAM_FLOOR, self.gpu.free(self.index) + have - minimum)
            await self._load_to(part, min(part.size, max(have, budget)))

    def free_for(self, nbytes: int, keep: set[Part]) -> None:
        """`free_memory`: unload weights not in `keep`, least recently used first, until
        `nbytes` are free; with smart memory the last one only as far as needed."""
        for part in list(self.loaded):
            if part in keep:
                continue
            if self.options.smart_memory:
                free = self.gpu.free(self.index)
                if free >= nbytes:
                    return
                if nbytes - free < self.loaded[part]:
                    self._shrink(part, nbytes - free)
                    return
            self.unload(part)

    def pressure(self, keep: set[Part]) -> None:
        """Dynamic VRAM between sampler steps: pay a deficit by evicting weights, or fault
        the offloaded weights of `keep` back in while the card has room."""
        if not self.options.dynamic:
            return
        room = self._dynamic_room()
        if room < 0:
            self._relieve(-room, keep)
            return
        # Resident ones first, then any a deficit had evicted whole.
        order = [p for p in self.loaded if p in keep]
        order += sorted((p for p in keep if p not in self.loaded), key=attrs.astuple)
        for part in order:
            grow = min(part.size - self.loaded.get(part, 0), room)
            if grow <= 0:
                continue
            self._allocate(grow, part.name)
            self.loaded[part] = self.loaded.get(part, 0) + grow
            room -= grow

    def _dynamic_room(self) -> int:
        """What comfy-aimdo's `budget_deficit` lets it take now (negative: its deficit)."""
        options = self.options
        by_card = self.gpu.free(self.index) - DYNAMIC_HEADROOM
        device = self.gpu.read().device(self.index)
        by_self = device.total - options.simple_headroom - self.torch_reserved
        return min(by_card, by_self) - options.headroom

    def _relieve(self, deficit: int, keep: set[Part]) -> None:
        """`vbars_free`: evict resident weights, other models' first, until `deficit` is paid."""
        order = [p for p in self.loaded if p not in keep] + [p for p in self.loaded if p in keep]
        for part in order:
            if deficit <= 0:
                return
            take = min(deficit, self.loaded[part])
            self._shrink(part, take)
            deficit -= take

    def _shrink(self, part: Part, nbytes: int) -> None:
        """`partially_unload`: move `nbytes` of `part` back to CPU RAM."""
        nbytes = min(nbytes, self.loaded[part])
        self.loaded[part] -= nbytes
        self.gpu.release(self.pid, nbytes, gpu=self.index)
        if self.loaded[part] == 0:
            del self.loaded[part]

    async def _load_to(self, part: Part, target: int) -> None:
        """Hold `target` bytes of `part`, filling over the load time."""
        have = self.loaded.get(part, 0)
        if target <= have:
            return
        seconds = self.load_seconds_per_gib * (target - have) / GiB
        steps = LOAD_STEPS if seconds > 0 else 1
        done = have
        try:
            for step in range(1, steps + 1):
                if seconds > 0:
                    await asyncio.sleep(seconds / steps)
                goal = have + (target - have) * step // steps
                self._allocate(goal - done, part.name)
                done = goal
        except TorchOutOfMemory:
            self.gpu.release(self.pid, done - have, gpu=self.index)
            raise
        self.loaded.pop(part, None)
        self.loaded[part] = target

    def unload(self, part: Part) -> None:
        """Every byte of `part` off the GPU."""
        nbytes = self.loaded.pop(part, 0)
        if nbytes:
            self.gpu.release(self.pid, nbytes, gpu=self.index)

    def unload_all(self) -> None:
        """`unload_all_models()`: every model's weights off the GPU."""
        for part in list(self.loaded):
            self.unload(part)

    def retain(self, parts: set[Part]) -> None:
        """Unload weights nothing references any more (their objects were collected)."""
        for part in list(self.loaded):
            if part not in parts:
                self.unload(part)

    @contextlib.asynccontextmanager
    async def working_set(self, nbytes: int, keep: set[Part]) -> AsyncIterator[None]:
        """Hold `nbytes` of activations for the duration of the block."""
        if self.options.dynamic:
            # The aimdo allocator pays its deficit before it allocates.
            self._relieve(nbytes + ALLOCATION_HEADROOM - self._dynamic_room(), set())
        else:
            self.free_for(nbytes, keep)
        self._allocate(nbytes, "working set")
        self.working += nbytes
        try:
            yield
        finally:
            self.working -= nbytes
            self.gpu.release(self.pid, nbytes, gpu=self.index)

    def release_all(self) -> None:
        """Everything back, the context included: the process is exiting."""
        self.loaded.clear()
        self.working = 0
        self.context = 0
        self.gpu.release(self.pid, gpu=self.index)

    def _allocate(self, nbytes: int, what: str) -> None:
        if nbytes <= 0:
            return
        try:
            self.gpu.allocate(self.pid, nbytes, gpu=self.index, name="python3")
        except GpuOutOfMemory as exc:
            raise TorchOutOfMemory(self._oom_message(nbytes, exc.free)) from None

    def _oom_message(self, requested: int, free: int) -> str:
        device = self.gpu.read().device(self.index)
        capacity = device.total - device.reserved
        in_use = self.gpu.read().held_by(self.pid, self.index)
        reserved = self.torch_reserved
        # PyTorch names its own device: ComfyUI's is cuda:0 of the GPUs it sees, whichever
        # card that is.
        return (
            f"CUDA out of memory. Tried to allocate {format_size(requested)}. GPU 0 "
            f"has a total capacity of {format_size(capacity)} of which {format_size(free)} is "
            f"free. Including non-PyTorch memory, this process has {format_size(in_use)} memory "
            f"in use. Of the allocated memory {format_size(reserved)} is allocated by PyTorch, "
            f"and 0 bytes is reserved by PyTorch but unallocated. If reserved but unallocated "
            f"memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to "
            f"avoid fragmentation.  See documentation for Memory Management  "
            f"(https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)"
        )
