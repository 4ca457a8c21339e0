"""Runtimes whose memory is their process's: allocated at start, held until exit.

Such a runtime has no unload and no listing. Its memory is a PROCESS-scope lease while it
starts and a resident that follows NVML once it shows; evicting it means stopping the
process (its `control`: a systemd unit or a command the gate runs), confirmed when NVML
shows the consumer's memory gone. What the gate does with that is in gpugate.gate.starts.
"""

from __future__ import annotations

import shlex
from typing import ClassVar

import aiohttp

from gpugate.config.model import Consumer
from gpugate.runtimes.base import (
    HealthSignal,
    LoadedModel,
    NotSupported,
    ReclaimRule,
    RuntimeAdapter,
)
from gpugate.runtimes.process import ProcessControl, SupervisedCommand, SystemdUnit

PROCESS_MODEL = "<process>"
"""The name a process's memory goes by when nothing names its model."""


def make_control(consumer: Consumer) -> ProcessControl | None:
    """The process control `consumer.control` describes; None without one."""
    control = consumer.control
    if control is None:
        return None
    if control.unit is not None:
        return SystemdUnit(
            control.unit,
            start_timeout=control.start_timeout + control.start_admission_timeout,
            stop_timeout=control.stop_timeout + 5.0,
        )
    return SupervisedCommand(
        control.command,
        env=dict(control.env),
        cwd=control.cwd,
        stop_grace=control.stop_timeout,
    )


class ProcessAdapter(RuntimeAdapter):
    """The part every process runtime shares: its control, its model, eviction by stop."""

    reconcilable: ClassVar[bool] = False
    reclaim_rule: ClassVar[ReclaimRule] = ReclaimRule(recovered_fraction=1.0, consumer_clear=True)

    @property
    def health_signal(self) -> HealthSignal:
        # Without a control the gate cannot tell a stopped process from a dead one: only
        # its health route says it is there.
        return HealthSignal.PROCESS if self.process is not None else HealthSignal.HEALTH_ROUTE

    def __init__(self, consumer: Consumer) -> None:
        super().__init__(consumer)
        self.process = make_control(consumer)
        self.unit_command: tuple[str, ...] | None = None
        """The command line the unit runs (read from systemd), once the gate read it."""
        self.current = self.start_model()

    def read_unit_command(self, argv: list[str]) -> None:
        """The unit's own command line: the model it starts with is the one it names."""
        before = self.start_model()
        self.unit_command = tuple(argv)
        if self.current == before:
            self.current = self.start_model()

    def start_model(self) -> str:
        """The model the process loads when it starts (its command's own option, else the
        consumer's only configured model)."""
        if len(self.consumer.models) == 1:
            return self.consumer.models[0].name
        return PROCESS_MODEL

    def commanded_model(self, *options: str) -> str | None:
        """The model the process's own command line names with one of `options` (the
        configured command, else the unit's as systemd reports it); None when it names none."""
        control = self.consumer.control
        command = control.command if control is not None and control.command else None
        for argv in (command, self.unit_command):
            model = command_option(argv, *options) if argv else None
            if model is not None:
                return model
        return None

    def process_model(self) -> str | None:
        return self.current

    def configured_envelope(self, model: str) -> int | None:
        """The model's envelope, else the consumer's (the process holds one model)."""
        return super().configured_envelope(model) or self.consumer.envelope

    def evict_timeout(self) -> float:
        control = self.consumer.control
        stop = control.stop_timeout if control is not None else 0.0
        return stop + self.consumer.timeouts.control

    async def listing(self, session: aiohttp.ClientSession) -> list[LoadedModel]:
        raise NotSupported(f"{self.consumer.name} cannot list what it holds (NVML decides)")

    async def evict(self, session: aiohttp.ClientSession, model: str) -> None:
        """A controlled process is evicted by its lifecycle (the core's Stop, or Sleep);
        without a control it cannot be."""
        if self.process is None:
            raise NotSupported(
                f"{self.consumer.name} has no control: the gate cannot stop it to free its memory"
            )
        raise NotSupported(f"{self.consumer.name} is evicted by stopping it, not by an unload")

    def process_ended(self) -> None:
        # The next process starts with the model its command names.
        self.current = self.start_model()


def command_option(command: tuple[str, ...], *names: str) -> str | None:
    """The value of the last of `names` in `command` (`-m X`, `--model X`, `--model=X`): the
    program's own options come last (an interpreter's `python -m MODULE` comes first)."""
    found = None
    for i, word in enumerate(command):
        for name in names:
            if word == name and i + 1 < len(command):
                found = command[i + 1]
            elif word.startswith(name + "=") and name.startswith("--"):
                found = word.split("=", 1)[1]
    return found


def describe_control(consumer: Consumer) -> str:
    """How the gate starts the consumer, for log lines."""
    control = consumer.control
    if control is None:
        return "not controlled"
    if control.unit is not None:
        return f"unit {control.unit}"
    return shlex.join(control.command)
