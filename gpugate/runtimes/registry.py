"""Which runtime speaks to a consumer's runtime.

A runtime with no entry here is not fronted: the gate observes its memory through NVML and
counts it, nothing more. `serve` hands the gate a registry's `runtime_for`; a registry also
carries the runtime table its configuration is read with, so a runtime added to one
(`RuntimeRegistry.adding`) is read and fronted like a shipped one.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

import attrs

from gpugate.config.model import Consumer, RuntimeSettings
from gpugate.config.runtime_table import RuntimeEntry, RuntimeTable
from gpugate.runtimes.comfyui.adapter import comfyui_runtime
from gpugate.runtimes.http import http_runtime
from gpugate.runtimes.llamaserver import llama_server_runtime
from gpugate.runtimes.ollama.adapter import ollama_runtime
from gpugate.runtimes.runtime import Runtime, RuntimeFactory
from gpugate.runtimes.sections import RUNTIME_TABLE
from gpugate.runtimes.vllm.adapter import vllm_runtime
from gpugate.runtimes.whisper.adapter import whisper_runtime


def _read_only(factories: Mapping[str, RuntimeFactory]) -> Mapping[str, RuntimeFactory]:
    return MappingProxyType(dict(factories))


@attrs.frozen
class RuntimeRegistry:
    """The runtimes a gate knows: the table its configuration is read with, and what builds
    the parts of each one it fronts."""

    table: RuntimeTable
    factories: Mapping[str, RuntimeFactory] = attrs.field(converter=_read_only)
    """By the runtime's name; a runtime of the table with none here is only observed. A
    factory may choose among a runtime's modes (llama-server's router or single model) by
    the consumer's configuration."""

    def __attrs_post_init__(self) -> None:
        stray = [name for name in self.factories if self.table.section(name) is None]
        if stray:
            raise ValueError(f"runtimes not in the table: {', '.join(stray)}")

    def factory(self, runtime: str) -> RuntimeFactory | None:
        """What builds the runtimes of a runtime kind; None when the gate only observes it."""
        return self.factories.get(runtime)

    def runtime_for(self, consumer: Consumer) -> Runtime | None:
        """A new runtime for a consumer; None when its runtime kind has none."""
        factory = self.factory(consumer.runtime)
        return None if factory is None else factory(consumer)

    def adding(
        self,
        name: str,
        factory: RuntimeFactory,
        section: type[RuntimeSettings] = RuntimeSettings,
    ) -> RuntimeRegistry:
        """This registry and runtime `name`: its section in the table, its factory here."""
        table = self.table.adding(RuntimeEntry(name, section))
        return RuntimeRegistry(table, {**self.factories, name: factory})


RUNTIMES = RuntimeRegistry(
    RUNTIME_TABLE,
    {
        "ollama": ollama_runtime,
        "comfyui": comfyui_runtime,
        "whisper": whisper_runtime,
        "llama-server": llama_server_runtime,
        "vllm": vllm_runtime,
        "http": http_runtime,
    },
)
"""The runtimes this gate ships, each fronted."""


def runtime_factory(runtime: str) -> RuntimeFactory | None:
    """What builds the runtimes of a shipped runtime kind; None when the gate only observes it."""
    return RUNTIMES.factory(runtime)


def runtime_for(consumer: Consumer) -> Runtime | None:
    """A new runtime for a consumer of a shipped runtime kind; None when it has none."""
    return RUNTIMES.runtime_for(consumer)
