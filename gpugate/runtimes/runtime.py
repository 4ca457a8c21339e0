"""A runtime: one consumer's configuration lookups and the parts its runtime has (parts.py).

Each runtime package builds its consumers' runtimes (its row of this record); the registry
(registry.py) maps a runtime's name to what builds them.
"""

from __future__ import annotations

from collections.abc import Callable

import attrs

from gpugate.config.model import Consumer, ModelOverride, Residency
from gpugate.core.classes import PriorityClass
from gpugate.runtimes.parts import (
    Health,
    Inventory,
    Jobs,
    Lifecycle,
    Memory,
    Placement,
    Reading,
    Residents,
    Vetting,
)


def _as_written(name: str) -> str:
    return name


class ModelSettings:
    """The consumer's configuration for a model: every runtime has these lookups."""

    def __init__(
        self,
        consumer: Consumer,
        *,
        model_key: Callable[[str], str] = _as_written,
        envelope: int | None = None,
    ) -> None:
        """`model_key`: the runtime's key for a model name as a client or the configuration
        writes it; `envelope`: the bytes of a model that names none (a process runtime's:
        its consumer's, the process holds one model)."""
        self.consumer = consumer
        self.model_key = model_key
        self._envelope = envelope
        self._overrides = {model_key(m.name): m for m in consumer.models}
        self._seen: dict[str, ModelOverride | None] = {}

    def override(self, model: str) -> ModelOverride | None:
        """The consumer's per-model settings for this model, if any."""
        # Looked up several times per request: remember by the name as clients write it.
        try:
            return self._seen[model]
        except KeyError:
            found = self._overrides.get(self.model_key(model))
            if len(self._seen) < 4096:
                self._seen[model] = found
            return found

    def residency(self, model: str) -> Residency:
        """The model's residency, else the consumer's."""
        override = self.override(model)
        return override.residency if override and override.residency else self.consumer.residency

    def model_priority(self, model: str) -> PriorityClass:
        """The model's class, else the consumer's."""
        override = self.override(model)
        return override.priority if override and override.priority else self.consumer.priority

    def configured_envelope(self, model: str) -> int | None:
        """The bytes consumers.yaml gives this model, if any."""
        override = self.override(model)
        return override.envelope if override and override.envelope else self._envelope

    def reload_seconds(self, model: str, nbytes: int) -> float:
        """Configured reload time, else a guess from the size (about 2 GiB/s from disk)."""
        override = self.override(model)
        if override and override.reload_seconds is not None:
            return override.reload_seconds
        return 1.0 + nbytes / (2 * 1024**3)

    def url(self, path: str) -> str:
        """The upstream's address for a path."""
        return self.consumer.upstream.url + path


@attrs.frozen
class Runtime:
    """One consumer's runtime: its configuration lookups and the parts it has; None for a
    part it lacks."""

    settings: ModelSettings
    reading: Reading
    residents: Residents
    health: Health
    memory: Memory
    """How it takes memory for a load, and what a load takes before the gate measured one:
    the only way the gate sizes a demand of it."""
    vetting: Vetting | None = None
    """Asked before a demand's lease whether the runtime will refuse it."""
    inventory: Inventory | None = None
    """Its listing, asked every listing interval: the books follow what it names."""
    jobs: Jobs | None = None
    """Its JOB leases end when it says their jobs ended."""
    lifecycle: Lifecycle | None = None
    """Its memory is its process's, from start to exit."""
    placement: Placement | None = None
    """It picks the GPU of its loads by its own rule (else the gate picks)."""


RuntimeFactory = Callable[[Consumer], Runtime]
"""Builds a consumer's runtime from its configuration (a runtime package's `runtime`)."""
