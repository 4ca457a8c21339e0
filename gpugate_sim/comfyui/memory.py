"""ComfyUI's model management, reduced to VRAM: what its one process holds on the card.

Everything is allocated on the simulated device under the ComfyUI process's PID: the CUDA
context at start, a model's weights when a node first needs them on the GPU
(`load_models_gpu`: loader nodes only read files), a sampler's working set while it
runs. Weights stay after the prompt (smart memory) until a load needs the room, `/free`
unloads them, or the node cache that referenced them drops them. An allocation the card
cannot hold raises `TorchOutOfMemory` with PyTorch's words.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterable

import attrs

from gpugate.core.units import GiB
from gpugate_sim.device import GpuOutOfMemory, SimulatedGpuHost

LOAD_STEPS = 4


@attrs.frozen
class Part:
    """Weights from one file with one role (a checkpoint holds model, clip and vae parts)."""

    folder: str
    name: str
    role: str
    size: int


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
        self, gpu: SimulatedGpuHost, index: int, pid: int, *, load_seconds_per_gib: float = 0.0
    ) -> None:
        self.gpu = gpu
        self.index = index
        self.pid = pid
        self.load_seconds_per_gib = load_seconds_per_gib
        self.loaded: dict[Part, None] = {}
        """Weights on the GPU, least recently used first."""
        self.working = 0
        self.context = 0

    @property
    def torch_reserved(self) -> int:
        """What PyTorch's allocator holds: weights and working sets, not the context."""
        return sum(part.size for part in self.loaded) + self.working

    def create_context(self, nbytes: int) -> None:
        """Hold the CUDA context, as a process does from its first CUDA call to its exit."""
        self._allocate(nbytes, "context")
        self.context = nbytes

    async def load(self, parts: Iterable[Part]) -> None:
        """Bring `parts` onto the GPU, evicting other weights first when the card is short."""
        wanted = list(dict.fromkeys(parts))
        for part in wanted:
            if part in self.loaded:
                self.loaded[part] = self.loaded.pop(part)
        missing = [part for part in wanted if part not in self.loaded]
        if not missing:
            return
        self.free_for(sum(part.size for part in missing), keep=set(wanted))
        for part in missing:
            await self._load_one(part)

    def free_for(self, nbytes: int, keep: set[Part]) -> None:
        """Unload weights not in `keep`, least recently used first, until `nbytes` are free."""
        for part in list(self.loaded):
            if self.gpu.free(self.index) >= nbytes:
                return
            if part not in keep:
                self.unload(part)

    async def _load_one(self, part: Part) -> None:
        seconds = self.load_seconds_per_gib * part.size / GiB
        steps = LOAD_STEPS if seconds > 0 else 1
        done = 0
        try:
            for step in range(1, steps + 1):
                if seconds > 0:
                    await asyncio.sleep(seconds / steps)
                target = part.size * step // steps
                self._allocate(target - done, part.name)
                done = target
        except TorchOutOfMemory:
            self.gpu.release(self.pid, done, gpu=self.index)
            raise
        self.loaded[part] = None

    def unload(self, part: Part) -> None:
        if part in self.loaded:
            del self.loaded[part]
            self.gpu.release(self.pid, part.size, gpu=self.index)

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
