"""Ollama's own section of a consumer (`ollama:`)."""

from __future__ import annotations

from typing import ClassVar

import attrs

from gpugate.config.model import RuntimeSettings


@attrs.frozen
class OllamaSettings(RuntimeSettings):
    """What Ollama's own environment sets that the gate must read requests by."""

    places_itself: ClassVar[bool] = True

    origins: tuple[str, ...] = ()
    """Extra origins browsers may call from (Ollama's OLLAMA_ORIGINS), `*` wildcards allowed."""
    sched_spread: bool = False
    """Ollama's OLLAMA_SCHED_SPREAD: it splits every model across all its GPUs rather than
    loading it on one where it fits (the gate leases where Ollama will load)."""
