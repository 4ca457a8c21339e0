"""Which adapter speaks to a consumer's runtime.

A runtime kind with no adapter here is not fronted: the gate observes its memory through
NVML and counts it, nothing more.
"""

from __future__ import annotations

from gpugate.config.model import Consumer, RuntimeKind
from gpugate.runtimes.base import RuntimeAdapter
from gpugate.runtimes.comfyui import ComfyUIAdapter
from gpugate.runtimes.http import HttpAdapter
from gpugate.runtimes.ollama import OllamaAdapter
from gpugate.runtimes.whisper import WhisperAdapter

ADAPTERS: dict[RuntimeKind, type[RuntimeAdapter]] = {
    RuntimeKind.OLLAMA: OllamaAdapter,
    RuntimeKind.COMFYUI: ComfyUIAdapter,
    RuntimeKind.WHISPER: WhisperAdapter,
    RuntimeKind.HTTP: HttpAdapter,
}


def adapter_class(kind: RuntimeKind) -> type[RuntimeAdapter] | None:
    """The adapter family for a runtime kind; None when the gate only observes it."""
    return ADAPTERS.get(kind)


def adapter_for(consumer: Consumer) -> RuntimeAdapter | None:
    """A new adapter for a consumer; None when its runtime has no adapter yet."""
    cls = adapter_class(consumer.runtime)
    return None if cls is None else cls(consumer)
