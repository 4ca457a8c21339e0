"""llama.cpp's `llama-server`: a router of many models (router.py) or one process with one
model (single.py). A consumer with a `control` (the gate starts and stops the process) is
a single-model server; without one the gate talks to a router already running."""

from __future__ import annotations

from gpugate.config.model import Consumer
from gpugate.runtimes.base import RuntimeAdapter
from gpugate.runtimes.llamaserver.router import LlamaRouterAdapter
from gpugate.runtimes.llamaserver.single import LlamaSingleAdapter


def llama_server_adapter(consumer: Consumer) -> RuntimeAdapter:
    """The adapter for a llama-server consumer, by the mode its configuration implies."""
    if consumer.control is not None:
        return LlamaSingleAdapter(consumer)
    return LlamaRouterAdapter(consumer)


__all__ = ["LlamaRouterAdapter", "LlamaSingleAdapter", "llama_server_adapter"]
