"""Ollama's own section of a consumer (`ollama:`)."""

from __future__ import annotations

from typing import ClassVar

import attrs

from gpugate.config.consumer import Consumer, RuntimeSettings
from gpugate.config.fields import SIZE
from gpugate.config.findings import Findings

KV_CACHE_TYPES = ("f16", "q8_0", "q4_0")
"""What Ollama's OLLAMA_KV_CACHE_TYPE takes (fs/ggml `SupportsKVCacheType`)."""


@attrs.frozen
class OllamaSettings(RuntimeSettings):
    """What Ollama's own environment sets that the gate must read requests by."""

    places_itself: ClassVar[bool] = True
    controlled: ClassVar[bool] = False

    origins: tuple[str, ...] = ()
    """Extra origins browsers may call from (Ollama's OLLAMA_ORIGINS), `*` wildcards allowed."""
    sched_spread: bool = False
    """Ollama's OLLAMA_SCHED_SPREAD: it splits every model across all its GPUs rather than
    loading it on one where it fits (the gate leases where Ollama will load)."""
    context_length: int = 0
    """Ollama's OLLAMA_CONTEXT_LENGTH: the context of a request that sets none (0: Ollama
    picks it from the VRAM it sees, 4096, 32768 or 262144)."""
    num_parallel: int = 1
    """Ollama's OLLAMA_NUM_PARALLEL: requests a loaded model serves at once, each with a
    context of its own in the KV cache."""
    kv_cache_type: str = "f16"
    """Ollama's OLLAMA_KV_CACHE_TYPE: f16, q8_0 or q4_0."""
    gpu_overhead: int = attrs.field(default=0, metadata=SIZE)
    """Ollama's OLLAMA_GPU_OVERHEAD: VRAM per GPU it leaves out of its sums."""

    def check(self, consumer: Consumer, path: str, findings: Findings) -> None:
        def where(key: str) -> str:
            nested = f"{path}.{consumer.runtime}.{key}"
            return nested if findings.line_of(nested) is not None else f"{path}.{key}"

        if self.kv_cache_type not in KV_CACHE_TYPES:
            findings.report(
                where("kv_cache_type"),
                f"expected one of {', '.join(KV_CACHE_TYPES)} (Ollama's OLLAMA_KV_CACHE_TYPE), "
                f"got {self.kv_cache_type!r}",
            )
        if self.num_parallel < 1:
            findings.report(where("num_parallel"), f"expected 1 or more, got {self.num_parallel}")
        if self.context_length < 0:
            findings.report(
                where("context_length"), f"expected 0 or more, got {self.context_length}"
            )
