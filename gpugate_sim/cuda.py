"""Which GPUs a simulated CUDA program sees: CUDA_VISIBLE_DEVICES, read as the CUDA runtime
reads it.

A CUDA program numbers the devices it sees 0, 1, ... (its ordinals). Without
CUDA_VISIBLE_DEVICES it sees every GPU of the host; with it, it sees the listed ones in the
listed order, so ordinal 0 is the first listed GPU. Each entry is a host index or a `GPU-`
UUID (a unique prefix is enough). The list ends at the first entry that names no device:
"1,7,0" on a two-GPU host is the same as "1", and "" or "-1" hide every GPU.

Ordinals follow NVML's (PCI bus) order, as with CUDA_DEVICE_ORDER=PCI_BUS_ID. The CUDA
runtime's default order (fastest first) can differ on a host with mixed cards; the
simulation does not rank cards by speed.

What a program does when it sees no GPU depends on the program, and each simulated runtime
says so: the ggml ones (whisper-server, llama-server) log `NO_DEVICE_GGML` and run on the
CPU; PyTorch ones (vLLM, ComfyUI) stop at start with `NO_DEVICE_TORCH`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

import attrs

from gpugate_sim.statefile import SimDevice

VISIBLE_ENV = "CUDA_VISIBLE_DEVICES"
NO_DEVICE = "no CUDA-capable device is detected"
"""cudaGetErrorString(cudaErrorNoDevice)."""
NO_DEVICE_GGML = f"ggml_cuda_init: failed to initialize CUDA: {NO_DEVICE}"
"""What ggml's CUDA backend logs when cudaGetDeviceCount fails (ggml-cuda.cu
`ggml_cuda_init`); it then registers no CUDA device and the program goes on."""
NO_DEVICE_TORCH = "RuntimeError: No CUDA GPUs are available"
"""PyTorch's error (c10/cuda `device_count_ensure_non_zero`) on first use of CUDA."""


@attrs.frozen
class CudaDevices:
    """The GPUs one process sees: its ordinal `i` is host GPU `host[i]`."""

    host: tuple[int, ...]

    @property
    def none(self) -> bool:
        """True when the process sees no GPU at all."""
        return not self.host

    def host_gpu(self, ordinal: int) -> int | None:
        """The host GPU of CUDA ordinal `ordinal`; None when the process has no such device."""
        if 0 <= ordinal < len(self.host):
            return self.host[ordinal]
        return None


def parse_visible(value: str | None, devices: Sequence[SimDevice]) -> CudaDevices:
    """The devices a CUDA_VISIBLE_DEVICES value (None: unset) leaves visible on a host."""
    indexes = [d.index for d in devices]
    if value is None:
        return CudaDevices(tuple(indexes))
    seen: list[int] = []
    for entry in value.split(","):
        gpu = _entry(entry.strip(), devices)
        # CUDA ignores the rest of the list from the first entry that names no device; a
        # device listed twice is taken as such an entry too.
        if gpu is None or gpu in seen:
            break
        seen.append(gpu)
    return CudaDevices(tuple(seen))


def _entry(word: str, devices: Sequence[SimDevice]) -> int | None:
    if word.isdigit():
        index = int(word)
        return index if any(d.index == index for d in devices) else None
    if word.upper().startswith("GPU-") and len(word) > len("GPU-"):
        matches = [d.index for d in devices if d.uuid.lower().startswith(word.lower())]
        return matches[0] if len(matches) == 1 else None
    return None


def visible_devices(
    devices: Sequence[SimDevice], environ: Mapping[str, str] | None = None
) -> CudaDevices:
    """What a process with `environ` (default: this process's environment) sees."""
    environ = os.environ if environ is None else environ
    return parse_visible(environ.get(VISIBLE_ENV), devices)
