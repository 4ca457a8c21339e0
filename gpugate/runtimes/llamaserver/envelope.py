"""How much a llama-server model takes on the GPU before it was ever measured.

weights offloaded + KV cache (f16, for the context the server runs with) + compute buffer
+ the process's CUDA context. A router's model runs in a child of its own, so each model
pays its own CUDA context. The gate reads the GGUF header from the path the server's
arguments name (the gate runs on the same host); once loaded, NVML's measurement of the
model replaces the estimate.
"""

from __future__ import annotations

import os
from pathlib import Path

from gpugate.runtimes.llamaserver.catalog import ModelEntry
from gpugate.runtimes.llamaserver.gguf import GgufError, GgufFacts, file_facts

MiB = 1024**2
CUDA_CONTEXT = 256 * MiB
"""A CUDA process's context and cuBLAS workspace before any model memory (as measured for
Ollama's runners, whose llama.cpp backend is the same)."""
UBATCH = 512
"""llama-server's default physical batch (`-ub`): the compute buffer scales with it."""

_FACTS: dict[tuple[str, int, int], GgufFacts] = {}


def gguf_facts(path: str) -> GgufFacts | None:
    """The header facts of the GGUF file at `path`, cached by its size and mtime; None when
    the gate cannot read it."""
    try:
        stat = os.stat(path)
    except OSError:
        return None
    key = (path, stat.st_size, stat.st_mtime_ns)
    facts = _FACTS.get(key)
    if facts is None:
        try:
            facts = file_facts(Path(path))
        except (OSError, GgufError):
            return None
        if len(_FACTS) > 256:
            _FACTS.clear()
        _FACTS[key] = facts
    return facts


def _int(text: str | None) -> int | None:
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


def load_bytes(facts: GgufFacts, n_ctx: int, n_gpu_layers: int | None) -> int:
    """Bytes a server of this model holds on the GPU with context `n_ctx` (0: the model's
    trained context, llama-server's default) and `n_gpu_layers` offloaded (None: all)."""
    ctx = n_ctx if n_ctx > 0 else facts.context_length
    layers = facts.n_layer
    offloaded = layers if n_gpu_layers is None or n_gpu_layers < 0 else min(n_gpu_layers, layers)
    if offloaded == 0:
        return CUDA_CONTEXT
    share = offloaded / layers if layers else 1.0
    weights = int(facts.weights * share)
    kv = int(facts.kv_cache_bytes(ctx) * share)
    compute = UBATCH * facts.n_embd * 4 * 8
    return weights + kv + compute + CUDA_CONTEXT


def estimate_entry(entry: ModelEntry) -> int | None:
    """The estimate for a model of the router's listing; None when its file is unreadable."""
    path = entry.option("-m", "--model")
    facts = gguf_facts(path) if path else None
    if facts is None:
        return None
    n_ctx = _int(entry.option("-c", "--ctx-size")) or 0
    ngl = entry.option("-ngl", "--n-gpu-layers", "--gpu-layers")
    layers = None if ngl in (None, "auto", "all") else _int(ngl)
    return load_bytes(facts, n_ctx, layers)
