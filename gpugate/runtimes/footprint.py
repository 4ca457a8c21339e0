"""What a runtime's `Memory` part answers: how its loads take memory, what one takes, and
the knob that tells it the most it may take.

The runtimes of today size themselves: ComfyUI loads a model partially when the card is
short, llama-server's `--fit` cuts its context and layers to what it sees free, vLLM takes
a fraction of the card's total. A load is therefore not one number but a range, from the
least the runtime runs it in (degraded: slower, or with less context) to what it takes
with room to spare; where the runtime cannot degrade (Ollama refuses to run a model
partly on the CPU under the gate) the two are one.
"""

from __future__ import annotations

import enum

import attrs


class Elasticity(enum.Enum):
    """How a runtime's load takes its memory."""

    FIXED = "fixed"
    """What its model and options say, whatever the card has free: short of it the load
    fails, or runs in a way the gate does not grant (Ollama's partial CPU offload)."""
    FITTED = "fitted"
    """Sized to what the runtime sees free when it loads, between a floor and a ceiling
    (ComfyUI's partial load, llama-server's `--fit`)."""
    SHARE = "share"
    """A fraction of the card's total, taken at start whatever the model (vLLM's
    `--gpu-memory-utilization`)."""


@attrs.frozen
class Footprint:
    """What one load takes on the card."""

    ceiling: int
    """With room to spare: everything on the card."""
    floor: int = attrs.field()
    """The least the runtime runs it in (degraded); the ceiling where it cannot degrade."""

    @floor.default
    def _floor(self) -> int:
        return self.ceiling

    @floor.validator
    def _check(self, attribute: attrs.Attribute[int], value: int) -> None:
        if not 0 <= value <= self.ceiling:
            raise ValueError(f"a floor of {value} bytes for a ceiling of {self.ceiling}")

    @classmethod
    def fixed(cls, nbytes: int) -> Footprint:
        """A load that takes `nbytes`, no more and no less."""
        return cls(nbytes, nbytes)

    @property
    def degrades(self) -> bool:
        return self.floor < self.ceiling


@attrs.frozen
class Cards:
    """What a runtime sees of the cards a load of it may go on, for sizes that follow from
    them (Ollama's default context, vLLM's share)."""

    totals: tuple[int, ...] = ()
    """Each card's total bytes (NVML), in the consumer's order; empty before a sample."""

    @property
    def total(self) -> int:
        return sum(self.totals)


@attrs.frozen
class Cap:
    """How a runtime is told the most it may hold: what goes on the command line of the
    process the gate starts (or a drop-in writes), into its environment, or into a
    request's options."""

    args: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    options: tuple[tuple[str, int], ...] = ()
    """Options of a request (Ollama's `num_ctx`)."""

    @property
    def empty(self) -> bool:
        return not (self.args or self.env or self.options)
