"""Where Ollama loads a model among its GPUs, predicted as its scheduler decides it.

`server/sched.go` `selectLlamaServerPlacement` (at ollama/ollama fb30760, Aug 2026):

* one GPU, or `num_gpu: 0` (CPU only): every GPU, nothing to choose;
* `main_gpu: N`: GPU N of the list, alone (`bestExplicitMainGPU`); outside the list the
  runner fails the load (llama.cpp: invalid value for main_gpu);
* unless OLLAMA_SCHED_SPREAD, the one GPU where the model's predicted size is at most 80 %
  of its available memory (`bestSingleGPUFit`), the one with the most available memory
  (`betterPlacementGPU`: strictly more, so of two equal GPUs the earlier one);
* otherwise the whole group, and llama-server (started with those GPUs visible) splits
  the layers across them; with no `--tensor-split` it shares them by each device's free
  memory (llama.cpp `load_tensors`: `splits[i] = free`), in whole layers.

A GPU's available memory is what Ollama reads from the driver less what it predicts its
own loaded runners still have to take (`updateFreeSpace`); the gate's `Card.free` is the
driver's figure less the loads it has leased that do not show yet.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import attrs

from gpugate.core.placement import Card, Share

FIT_PERCENT = 80
"""sched.go: a model fits one GPU when it needs at most 80 % of its available memory."""


@attrs.frozen
class OllamaPlacement:
    """Ollama's rule for one request's load (its options read from the request)."""

    spread: bool = False
    """OLLAMA_SCHED_SPREAD: always the whole group."""
    main_gpu: int | None = None
    num_gpu: int | None = None
    layers: int | None = None
    """The model's block count, when known: a split is in whole layers."""

    def place(self, nbytes: int, cards: Sequence[Card]) -> tuple[Share, ...] | None:
        """The GPUs and bytes per GPU Ollama loads `nbytes` with; None when it fits on no
        GPU and not across all of them (it would load partly on the CPU, or evict)."""
        if not cards:
            return None
        if len(cards) == 1 or self.num_gpu == 0 or nbytes <= 0:
            return (Share(cards[0].gpu, nbytes),) if len(cards) == 1 else None
        if self.main_gpu is not None:
            if 0 <= self.main_gpu < len(cards):
                return (Share(cards[self.main_gpu].gpu, nbytes),)
            # Outside the group Ollama passes it through to llama-server, which fails the
            # load (or, below 0, puts nothing on a GPU): no GPU to lease on.
            return None
        if not self.spread:
            best: Card | None = None
            for card in cards:
                if nbytes > card.free * FIT_PERCENT // 100:
                    continue
                if best is None or card.free > best.free:
                    best = card
            if best is not None:
                return (Share(best.gpu, nbytes),)
        return self.split(nbytes, cards)

    def split(self, nbytes: int, cards: Sequence[Card]) -> tuple[Share, ...] | None:
        """llama-server's default layer split (llama.cpp `load_tensors` with no tensor
        split): the cumulative shares of free memory are the split points, and offloaded
        layer `il` of `n` goes to the first device whose point lies above `il / n`. With
        the block count known, `n` is it plus the output layer and each device takes its
        layers' bytes (the last layer's device the remainder); unknown, the bytes follow
        the free memory."""
        free = [c.free for c in cards]
        total = sum(free)
        if total <= 0 or nbytes > total:
            return None
        if self.layers:
            layers = self.layers + 1
            counts = [0] * len(cards)
            cumulative = list(itertools.accumulate(free))
            for il in range(layers):
                device = next(
                    (k for k, point in enumerate(cumulative) if point * layers > il * total),
                    len(cards) - 1,
                )
                counts[device] += 1
            sizes = [nbytes * count // layers for count in counts]
            last = max(k for k, count in enumerate(counts) if count)
        else:
            sizes = [nbytes * f // total for f in free]
            last = len(cards) - 1
        sizes[last] += nbytes - sum(sizes)
        if any(size > c.free for size, c in zip(sizes, cards, strict=True)):
            return None
        return tuple(Share(c.gpu, size) for c, size in zip(cards, sizes, strict=True) if size)


def from_options(options_key: str, *, spread: bool, layers: int | None) -> OllamaPlacement:
    """The rule for a request whose runner options read `options_key` ("main_gpu=1,...")."""
    values: dict[str, int] = {}
    for item in options_key.split(","):
        name, _, text = item.partition("=")
        if name in ("main_gpu", "num_gpu"):
            try:
                values[name] = int(text)
            except ValueError:
                continue
    num_gpu = values.get("num_gpu")
    # sched.go: a negative num_gpu is "auto", as if it were not given.
    return OllamaPlacement(
        spread=spread,
        main_gpu=values.get("main_gpu"),
        num_gpu=None if num_gpu is not None and num_gpu < 0 else num_gpu,
        layers=layers,
    )
