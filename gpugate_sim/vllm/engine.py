"""vLLM's engine as far as VRAM and sleep mode go: what it takes at start, frees, takes back.

At start (vllm/v1/worker/gpu_worker.py `init_device`, vllm/v1/worker/utils.py
`request_memory`) the worker creates its CUDA context, then refuses to go on when the
card's free memory is below `gpu_memory_utilization` x its TOTAL memory. It then loads the
weights, profiles a forward pass and gives the KV cache whatever is left of that fraction,
so a running server holds `utilization x total` whatever its model's size.

With `--enable-sleep-mode` the weights and the KV cache are allocated through
CuMemAllocator (vllm/device_allocator/cumem.py) under the tags `weights` and `kv_cache`;
sleep unmaps exactly those allocations (level 1 copies `weights` to CPU memory first,
level 2 keeps nothing), so the CUDA context and PyTorch's own cache stay: the residual.
A wake remaps them (`tags` picks which) and copies level-1 weights back; level-2 weights
come back mapped but empty until `reload_weights`.

The scheduler side (vllm/v1/engine/core.py `sleep`, `wake_up`, `pause_scheduler`): a sleep
first pauses scheduling (mode `abort`: in-flight requests end as aborted; `wait`: they
finish first; `keep`: they are frozen), new requests queue, and scheduling resumes only
once every tag is resident again.
"""

from __future__ import annotations

import asyncio
import enum
import os
import time
from collections.abc import Callable
from typing import TextIO

import attrs

from gpugate.core.units import GiB
from gpugate_sim.device import GpuOutOfMemory, SimulatedGpuHost

PROCESS_NAME = "vllm"
PAUSE_MODES = ("abort", "wait", "keep")


class StartupFailed(Exception):
    """The engine could not start; `lines` are what vLLM prints for it."""

    def __init__(self, lines: list[str]) -> None:
        super().__init__("\n".join(lines))
        self.lines = lines


class WakeFailed(Exception):
    """A remap did not fit (cuMemCreate out of memory); the tags stay asleep."""


class Residency(enum.Enum):
    RESIDENT = "resident"
    OFFLOADED = "offloaded"
    """Unmapped, its content in CPU memory (level-1 weights)."""
    DISCARDED = "discarded"
    """Unmapped, its content lost."""
    EMPTY = "empty"
    """Mapped again, its content lost (level-2 weights before reload_weights)."""

    @property
    def mapped(self) -> bool:
        return self in (Residency.RESIDENT, Residency.EMPTY)


def gib(nbytes: float) -> float:
    """vLLM's `round(bytes / GiB_bytes, 2)` for its messages."""
    return round(nbytes / GiB, 2)


@attrs.frozen
class Plan:
    """What the engine holds, by part."""

    gpu: int
    utilization: float
    context: int
    overhead: int
    weights: int
    max_model_len: int
    kv_bytes_per_token: int
    load_seconds: float
    init_seconds: float
    sleep_seconds: float
    wake_seconds: float


class Engine:
    """The memory and the sleep state of one server process, held under its own PID."""

    def __init__(self, gpu_host: SimulatedGpuHost, plan: Plan, *, sleep_mode: bool) -> None:
        self.gpu_host = gpu_host
        self.plan = plan
        self.sleep_mode = sleep_mode
        self.pid = os.getpid()
        self.kv_cache = 0
        self.tags = {"weights": Residency.RESIDENT, "kv_cache": Residency.RESIDENT}
        self.scheduling = asyncio.Event()
        self.scheduling.set()
        self.aborts = 0
        """Bumped by a sleep in `abort` mode: a request started before it ends aborted."""
        self.frozen = False
        """Paused in `keep` mode: in-flight requests stop between two tokens."""
        self.in_flight = 0
        self.idle = asyncio.Event()
        """Set while no request is generating (a `wait` sleep waits for it)."""
        self.idle.set()
        self.lock = asyncio.Lock()
        """Sleep, wake and reload run one at a time, as the engine core's utility calls."""

    # -- start (blocking: nothing else runs before the port is served) --------------------

    def start(self, say: Callable[[str], None]) -> None:
        """Take the context, check free memory, load the weights, size and take the KV cache.

        Raises StartupFailed; nothing stays allocated after it.
        """
        plan = self.plan
        try:
            self._take(plan.context)
        except GpuOutOfMemory:
            raise StartupFailed(["RuntimeError: CUDA error: out of memory"]) from None
        state = self.gpu_host.read()
        total, free = state.device(plan.gpu).total, state.free(plan.gpu)
        requested = total * plan.utilization
        if free < requested:
            self.free_all()
            # PyTorch's device names count the GPUs the process sees: its card is cuda:0.
            raise StartupFailed([
                f"ValueError: Free memory on device cuda:0 ({gib(free)}/{gib(total)} "
                f"GiB) on startup is less than desired GPU memory utilization "
                f"({plan.utilization}, {gib(requested)} GiB). Decrease GPU memory "
                "utilization or reduce GPU memory used by other processes.",
            ])  # fmt: skip
        self._take_or_fail(plan.weights)
        time.sleep(plan.load_seconds)
        say(f"Loading weights took {plan.load_seconds:.2f} seconds")
        self._take_or_fail(plan.overhead)
        kv_cache = int(requested) - plan.context - plan.weights - plan.overhead
        if kv_cache <= 0:
            self.free_all()
            raise StartupFailed([
                "ValueError: No available memory for the cache blocks. Try increasing "
                "`gpu_memory_utilization` when initializing the engine.",
            ])  # fmt: skip
        self._check_model_len(kv_cache)
        self._take_or_fail(kv_cache)
        self.kv_cache = kv_cache
        say(f"Available KV cache memory: {gib(kv_cache)} GiB")
        time.sleep(plan.init_seconds)

    def _check_model_len(self, kv_cache: int) -> None:
        per_token = self.plan.kv_bytes_per_token
        needed = self.plan.max_model_len * per_token
        if not per_token or needed <= kv_cache:
            return
        self.free_all()
        raise StartupFailed([
            f"ValueError: To serve at least one request with the models's max seq len "
            f"({self.plan.max_model_len}), ({gib(needed)} GiB KV cache is needed, which is "
            f"larger than the available KV cache memory ({gib(kv_cache)} GiB). Based on the "
            f"available memory, the estimated maximum model length is {kv_cache // per_token}."
            " Try increasing `gpu_memory_utilization` or decreasing `max_model_len` when "
            "initializing the engine.",
        ])  # fmt: skip

    def _take_or_fail(self, nbytes: int) -> None:
        try:
            self._take(nbytes)
        except GpuOutOfMemory as exc:
            self.free_all()
            raise StartupFailed([
                f"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate "
                f"{gib(exc.requested)} GiB. GPU 0 has a total capacity of "
                f"{gib(self.gpu_host.read().device(self.plan.gpu).total)} GiB of which "
                f"{gib(exc.free)} GiB is free.",
            ]) from None  # fmt: skip

    def _take(self, nbytes: int) -> None:
        self.gpu_host.allocate(self.pid, nbytes, gpu=self.plan.gpu, name=PROCESS_NAME)

    def _give(self, nbytes: int) -> None:
        if nbytes:
            self.gpu_host.release(self.pid, nbytes, gpu=self.plan.gpu)

    def free_all(self) -> None:
        """Process exit: the driver takes everything back."""
        self.gpu_host.release(self.pid, gpu=self.plan.gpu)

    # -- sleep and wake ------------------------------------------------------------------

    @property
    def sleeping(self) -> bool:
        """`is_sleeping`: scheduling paused, or some tag not resident."""
        unmapped = any(not r.mapped for r in self.tags.values())
        return unmapped or not self.scheduling.is_set()

    @property
    def weights_valid(self) -> bool:
        return self.tags["weights"] is Residency.RESIDENT

    def _size(self, tag: str) -> int:
        return self.plan.weights if tag == "weights" else self.kv_cache

    async def sleep(self, level: int, mode: str, err: TextIO) -> None:
        """`EngineCore.sleep`: pause scheduling, then (level >= 1) unmap the pool."""
        if mode not in PAUSE_MODES:
            raise ValueError(f"Invalid pause mode: {mode}")
        if level >= 1 and not self.sleep_mode:
            raise ValueError("Sleep mode is not enabled.")
        async with self.lock:
            self.scheduling.clear()
            if mode == "abort":
                self.aborts += 1
            elif mode == "keep":
                self.frozen = True
            elif mode == "wait":
                await self.idle.wait()
            if level < 1:
                return
            if not any(r.mapped for r in self.tags.values()):
                err.write("WARNING Executor is already sleeping.\n")
                return
            started = time.perf_counter()
            offload = ("weights",) if level == 1 else ()
            freed = backed_up = 0
            for tag, residency in self.tags.items():
                if not residency.mapped:
                    continue
                size = self._size(tag)
                freed += size
                keep = tag in offload and residency is Residency.RESIDENT
                backed_up += size if keep else 0
                self.tags[tag] = Residency.OFFLOADED if keep else Residency.DISCARDED
            # Copying the weights out takes the time; the driver sees the memory go at the end.
            await asyncio.sleep(self.plan.sleep_seconds if backed_up else 0)
            self._give(freed)
            err.write(
                f"INFO CuMemAllocator: sleep freed {freed / GiB:.2f} GiB memory in total, of "
                f"which {backed_up / GiB:.2f} GiB is backed up in CPU and the rest "
                f"{(freed - backed_up) / GiB:.2f} GiB is discarded directly.\n"
                f"INFO It took {time.perf_counter() - started:.6f} seconds to fall asleep.\n"
            )
            err.flush()

    async def wake_up(self, tags: list[str] | None, err: TextIO) -> None:
        """`EngineCore.wake_up`: remap `tags` (all when None); resume once all are resident."""
        if tags is not None:
            tags = [t for t in tags if t != "scheduling"]
        async with self.lock:
            if tags is None or tags:
                await self._remap(tags, err)
            if all(r.mapped for r in self.tags.values()):
                self.frozen = False
                self.scheduling.set()

    async def _remap(self, tags: list[str] | None, err: TextIO) -> None:
        if all(r.mapped for r in self.tags.values()):
            err.write("WARNING Executor is not sleeping.\n")
            return
        wanted = [t for t in self.tags if tags is None or t in tags]
        for tag in tags or ():
            if tag not in self.tags:
                err.write(f"WARNING Tag {tag} is not in sleeping tags\n")
        waking = [t for t in wanted if not self.tags[t].mapped]
        size = sum(self._size(t) for t in waking)
        try:
            self._take(size)
        except GpuOutOfMemory as exc:
            raise WakeFailed(f"CUDA Error: out of memory at {exc}") from None
        copied = False
        for tag in waking:
            copied = copied or self.tags[tag] is Residency.OFFLOADED
            self.tags[tag] = (
                Residency.RESIDENT
                if self.tags[tag] is Residency.OFFLOADED or tag == "kv_cache"
                else Residency.EMPTY
            )
        # The memory is mapped first; the copy back from CPU memory takes the time.
        await asyncio.sleep(self.plan.wake_seconds if copied else 0)

    async def reload_weights(self) -> None:
        """`collective_rpc("reload_weights")`: read the weights from disk into their memory."""
        async with self.lock:
            if not self.tags["weights"].mapped:
                raise RuntimeError("the weights are not mapped: wake them up first")
            await asyncio.sleep(self.plan.load_seconds)
            self.tags["weights"] = Residency.RESIDENT
