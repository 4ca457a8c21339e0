"""How a llama-server runner lays a model over the GPUs Ollama gave it: bytes per GPU.

llama.cpp (src/llama-model.cpp `load_tensors`, as vendored by llama-cpp-python 0.3.36)
assigns whole layers to devices. With no `--tensor-split` (Ollama passes none) the split
is by each device's free memory at load time: the cumulative free fractions are the split
points, and layer `il` of the `n` offloaded ones goes to the first device whose point is
above `il / n` (`std::upper_bound`). A model on every GPU offloads `block_count + 1`
layers: the repeating blocks and the output layer, the last one.

Simplified here: every offloaded layer weighs the same (the runner's bytes divided evenly,
the remainder of the division to the device of the last layer), the KV cache and compute
buffers travel with the layers, and the split points are compared exactly (llama.cpp uses
float32 fractions, which can differ at an exact boundary). llama-server's `--fit`, which
moves layers when a device would keep less than its 1 GiB target free, is modelled only
for a model that does not fit: each GPU then keeps `fit_margin` free.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs


@attrs.frozen
class Layout:
    """A runner's VRAM: bytes per host GPU, and how many layers are offloaded."""

    shares: tuple[tuple[int, int], ...]
    """(host GPU, bytes) for each GPU the runner was given, in its device order."""
    gpu_layers: int

    @property
    def vram(self) -> int:
        """The runner's bytes on all GPUs together (/api/ps `size_vram`)."""
        return sum(nbytes for _, nbytes in self.shares)

    def on(self, gpu: int) -> int:
        """The runner's bytes on host GPU `gpu`."""
        return sum(nbytes for index, nbytes in self.shares if index == gpu)


def layer_devices(layers: int, free: Sequence[int]) -> tuple[int, ...]:
    """How many of `layers` offloaded layers each device gets, split by free memory.

    Layer `il` goes to the first device `k` with cum_free[k] / sum_free > il / layers, i.e.
    cum_free[k] * layers > il * sum_free. With no free memory anywhere the split is even
    (llama.cpp's split for an all-zero tensor split).
    """
    if not free:
        return ()
    weights = list(free) if sum(free) > 0 else [1] * len(free)
    total = sum(weights)
    cumulative = []
    running = 0
    for weight in weights:
        running += weight
        cumulative.append(running)
    counts = [0] * len(weights)
    for il in range(layers):
        device = next(
            (k for k, point in enumerate(cumulative) if point * layers > il * total),
            len(weights) - 1,
        )
        counts[device] += 1
    return tuple(counts)


def split_bytes(nbytes: int, layers: int, free: Sequence[int]) -> tuple[int, ...]:
    """`nbytes` spread over the devices as their layers are: `nbytes * count // layers`
    each, the remainder to the device that holds the last layer."""
    if not free:
        return ()
    if layers <= 0 or nbytes <= 0:
        return (0,) * len(free)
    counts = layer_devices(layers, free)
    shares = [nbytes * count // layers for count in counts]
    last = max(k for k, count in enumerate(counts) if count > 0)
    shares[last] += nbytes - sum(shares)
    return tuple(shares)


def lay_out(
    gpus: Sequence[int],
    free: Sequence[int],
    *,
    size: int,
    block_count: int,
    explicit: int | None,
    fit_margin: int,
) -> Layout:
    """The bytes a runner of `size` bytes takes on each of `gpus` (with `free` bytes free).

    `explicit`: the bytes an explicit `num_gpu` puts on the GPUs (None: automatic). An
    automatic load that fits (every GPU's part within its free memory) is whole; one that
    does not keeps `fit_margin` free on each GPU and leaves the rest in system memory.
    """
    if not gpus:
        return Layout((), 0)
    if explicit is not None:
        vram = explicit
        layers = block_count * vram // size if vram < size else block_count + 1
        shares = split_bytes(vram, max(layers, 1 if vram else 0), free)
        return Layout(tuple(zip(gpus, shares, strict=True)), layers)
    whole = split_bytes(size, block_count + 1, free)
    if all(part <= room for part, room in zip(whole, free, strict=True)):
        return Layout(tuple(zip(gpus, whole, strict=True)), block_count + 1)
    shares = tuple(
        min(part, max(0, room - fit_margin)) for part, room in zip(whole, free, strict=True)
    )
    vram = sum(shares)
    return Layout(tuple(zip(gpus, shares, strict=True)), block_count * vram // size)
