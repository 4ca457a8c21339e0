"""vLLM's own section of a consumer (`vllm:`)."""

from __future__ import annotations

import attrs

from gpugate.config.consumer import Consumer, RuntimeSettings
from gpugate.config.findings import Findings


@attrs.frozen
class VllmSettings(RuntimeSettings):
    """How an eviction puts vLLM to sleep."""

    sleep_level: int = 1
    """The sleep level an eviction asks for (1: weights kept in CPU memory, a quick wake;
    2: weights dropped, loaded again at wake)."""

    def check(self, consumer: Consumer, path: str, findings: Findings) -> None:
        if self.sleep_level not in (1, 2):
            where = f"{path}.{consumer.runtime}.sleep_level"
            if findings.line_of(where) is None:
                where = f"{path}.sleep_level"
            findings.report(where, f"expected 1 or 2 (vLLM's sleep levels), got {self.sleep_level}")
        if consumer.envelope is None:
            findings.report(
                f"{path}.envelope",
                "a vllm consumer needs an envelope: the bytes a wake takes back (its weights and "
                "KV cache: about gpu_memory_utilization of the card, less what it keeps asleep)",
            )
