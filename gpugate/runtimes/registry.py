"""Which adapter speaks to a consumer's runtime.

A runtime with no adapter here is not fronted: the gate observes its memory through
NVML and counts it, nothing more.
"""

from __future__ import annotations

from collections.abc import Callable

from gpugate.config.model import Consumer
from gpugate.runtimes.base import RuntimeAdapter
from gpugate.runtimes.comfyui.adapter import ComfyUIAdapter
from gpugate.runtimes.http import HttpAdapter
from gpugate.runtimes.llamaserver import llama_server_adapter
from gpugate.runtimes.ollama.adapter import OllamaAdapter
from gpugate.runtimes.vllm.adapter import VllmAdapter
from gpugate.runtimes.whisper.adapter import WhisperAdapter

AdapterFactory = Callable[[Consumer], RuntimeAdapter]
"""Builds a consumer's adapter: an adapter class, or a function choosing among a runtime's
modes (llama-server's router or single model) by the consumer's configuration."""

ADAPTERS: dict[str, AdapterFactory] = {
    "ollama": OllamaAdapter,
    "comfyui": ComfyUIAdapter,
    "whisper": WhisperAdapter,
    "llama-server": llama_server_adapter,
    "vllm": VllmAdapter,
    "http": HttpAdapter,
}
"""By the runtime's name, as runtimes/sections.py registers its configuration section."""


def adapter_class(runtime: str) -> AdapterFactory | None:
    """What builds the adapters of a runtime; None when the gate only observes it."""
    return ADAPTERS.get(runtime)


def adapter_for(consumer: Consumer) -> RuntimeAdapter | None:
    """A new adapter for a consumer; None when its runtime has no adapter yet."""
    factory = adapter_class(consumer.runtime)
    return None if factory is None else factory(consumer)
