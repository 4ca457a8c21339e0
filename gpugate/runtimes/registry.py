"""Which runtime speaks to a consumer's runtime.

A runtime with no entry here is not fronted: the gate observes its memory through NVML and
counts it, nothing more.
"""

from __future__ import annotations

from gpugate.config.model import Consumer
from gpugate.runtimes.comfyui.adapter import comfyui_runtime
from gpugate.runtimes.http import http_runtime
from gpugate.runtimes.llamaserver import llama_server_runtime
from gpugate.runtimes.ollama.adapter import ollama_runtime
from gpugate.runtimes.runtime import Runtime, RuntimeFactory
from gpugate.runtimes.vllm.adapter import vllm_runtime
from gpugate.runtimes.whisper.adapter import whisper_runtime

RUNTIMES: dict[str, RuntimeFactory] = {
    "ollama": ollama_runtime,
    "comfyui": comfyui_runtime,
    "whisper": whisper_runtime,
    "llama-server": llama_server_runtime,
    "vllm": vllm_runtime,
    "http": http_runtime,
}
"""By the runtime's name, as runtimes/sections.py registers its configuration section. A
factory may choose among a runtime's modes (llama-server's router or single model) by the
consumer's configuration."""


def runtime_factory(runtime: str) -> RuntimeFactory | None:
    """What builds the runtimes of a runtime kind; None when the gate only observes it."""
    return RUNTIMES.get(runtime)


def runtime_for(consumer: Consumer) -> Runtime | None:
    """A new runtime for a consumer; None when its runtime kind has none yet."""
    factory = runtime_factory(consumer.runtime)
    return None if factory is None else factory(consumer)
