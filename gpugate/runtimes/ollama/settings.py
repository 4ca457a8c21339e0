"""Ollama's own section of a consumer (`ollama:`)."""

from __future__ import annotations

import attrs

from gpugate.config.model import RuntimeSettings


@attrs.frozen
class OllamaSettings(RuntimeSettings):
    """What Ollama's own environment sets that the gate must read requests by."""

    origins: tuple[str, ...] = ()
    """Extra origins browsers may call from (Ollama's OLLAMA_ORIGINS), `*` wildcards allowed."""
