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
from collections.abc import Mapping, Sequence

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
class Knob:
    """The setting a cap is, under every name the runtime reads it by: an operator who set
    it on the command line or in the environment has the last word, and the gate writes it
    only where neither does."""

    names: tuple[str, ...]
    """Its command-line names (`-c`, `--ctx-size`)."""
    env: str = ""
    """The environment variable that sets it too (llama.cpp's `LLAMA_ARG_CTX_SIZE`), if any."""

    def set_in(self, argv: Sequence[str], env: Mapping[str, str]) -> str | None:
        """How `argv` or `env` already sets it (`-c 8192`, `LLAMA_ARG_CTX_SIZE=8192`), or
        None. A long name counts with `=VALUE` and with `_` for `-` (argparse, and
        llama.cpp's common/arg.cpp `common_params_parse_ex`, which reads `--ctx_size`)."""
        for i, word in enumerate(argv):
            name = word
            if word.startswith("--"):
                name = word.split("=", 1)[0].replace("_", "-")
            if name in self.names:
                value = argv[i + 1] if "=" not in word and i + 1 < len(argv) else None
                return word if value is None else f"{word} {value}"
        if self.env and env.get(self.env, "") != "":
            return f"{self.env}={env[self.env]}"
        return None


@attrs.frozen
class Cap:
    """How a runtime is told the most it may hold: what goes on the command line of the
    process the gate starts (or a drop-in writes), into its environment, or into a
    request's options."""

    args: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    options: tuple[tuple[str, int], ...] = ()
    """Options of a request (Ollama's `num_ctx`)."""
    knob: Knob | None = attrs.field(default=None, eq=False)
    """The setting `args` and `env` are, by all its names: what says an operator set it."""

    @property
    def empty(self) -> bool:
        return not (self.args or self.env or self.options)

    def onto(self, argv: Sequence[str], env: Mapping[str, str]) -> Capped:
        """`argv` and `env` with this cap added, unless they set its knob already: then as
        they are, and `kept` says how they set it (the operator's own value wins)."""
        knob = self.knob or Knob(self.args[:1])
        kept = knob.set_in(argv, env) or next(
            (f"{name}={env[name]}" for name, _ in self.env if env.get(name, "") != ""), None
        )
        if kept is not None or self.empty:
            return Capped(tuple(argv), {}, kept)
        return Capped((*argv, *self.args), dict(self.env), None)


@attrs.frozen
class Capped:
    """A command line and the environment it runs with, told its cap (`Cap.onto`)."""

    argv: tuple[str, ...]
    env: dict[str, str]
    """Variables to add to the environment it runs with."""
    kept: str | None = None
    """How the command or its environment already set the knob, kept as it is."""
