"""Which adapter speaks to a consumer's runtime.

A runtime with no adapter here is not fronted: the gate observes its memory through
NVML and counts it, nothing more. `serve` hands the gate a registry's `adapter_for`; a
registry also carries the runtime table its configuration is read with, so a runtime added
to one (`RuntimeRegistry.adding`) is read and fronted like a shipped one.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType

import attrs

from gpugate.config.model import Consumer, RuntimeSettings
from gpugate.config.runtime_table import RuntimeEntry, RuntimeTable
from gpugate.runtimes.base import RuntimeAdapter
from gpugate.runtimes.comfyui.adapter import ComfyUIAdapter
from gpugate.runtimes.http import HttpAdapter
from gpugate.runtimes.llamaserver import llama_server_adapter
from gpugate.runtimes.ollama.adapter import OllamaAdapter
from gpugate.runtimes.sections import RUNTIME_TABLE
from gpugate.runtimes.vllm.adapter import VllmAdapter
from gpugate.runtimes.whisper.adapter import WhisperAdapter

AdapterFactory = Callable[[Consumer], RuntimeAdapter]
"""Builds a consumer's adapter: an adapter class, or a function choosing among a runtime's
modes (llama-server's router or single model) by the consumer's configuration."""


def _read_only(factories: Mapping[str, AdapterFactory]) -> Mapping[str, AdapterFactory]:
    return MappingProxyType(dict(factories))


@attrs.frozen
class RuntimeRegistry:
    """The runtimes a gate knows: the table its configuration is read with, and what builds
    the adapter of each one it fronts."""

    table: RuntimeTable
    adapters: Mapping[str, AdapterFactory] = attrs.field(converter=_read_only)
    """By the runtime's name; a runtime of the table with none here is only observed."""

    def __attrs_post_init__(self) -> None:
        stray = [name for name in self.adapters if self.table.section(name) is None]
        if stray:
            raise ValueError(f"adapters for runtimes not in the table: {', '.join(stray)}")

    def adapter_class(self, runtime: str) -> AdapterFactory | None:
        """What builds the adapters of a runtime; None when the gate only observes it."""
        return self.adapters.get(runtime)

    def adapter_for(self, consumer: Consumer) -> RuntimeAdapter | None:
        """A new adapter for a consumer; None when its runtime has no adapter."""
        factory = self.adapter_class(consumer.runtime)
        return None if factory is None else factory(consumer)

    def adding(
        self, name: str, adapter: AdapterFactory, section: type[RuntimeSettings] = RuntimeSettings
    ) -> RuntimeRegistry:
        """This registry and runtime `name`: its section in the table, its adapter here."""
        table = self.table.adding(RuntimeEntry(name, section))
        return RuntimeRegistry(table, {**self.adapters, name: adapter})


RUNTIMES = RuntimeRegistry(
    RUNTIME_TABLE,
    {
        "ollama": OllamaAdapter,
        "comfyui": ComfyUIAdapter,
        "whisper": WhisperAdapter,
        "llama-server": llama_server_adapter,
        "vllm": VllmAdapter,
        "http": HttpAdapter,
    },
)
"""The runtimes this gate ships, each fronted."""

ADAPTERS = RUNTIMES.adapters
"""The shipped runtimes' adapter builders by name (read-only: a runtime is added to a
registry of its own with `RuntimeRegistry.adding`)."""


def adapter_class(runtime: str) -> AdapterFactory | None:
    """What builds the adapters of a shipped runtime; None when the gate only observes it."""
    return RUNTIMES.adapter_class(runtime)


def adapter_for(consumer: Consumer) -> RuntimeAdapter | None:
    """A new adapter for a consumer of a shipped runtime; None when it has no adapter."""
    return RUNTIMES.adapter_for(consumer)
