"""Runtimes whose memory is their process's: allocated at start, held until exit.

Such a runtime has no unload and no listing. Its memory is a PROCESS-scope lease while it
starts and a resident that follows NVML once it shows; evicting it means stopping the
process (its `control`: a systemd unit or a command the gate runs), confirmed when NVML
shows the consumer's memory gone. What the gate does with that is in gpugate.gate.starts.

Every process runtime (whisper-server, a single-model llama-server, vLLM, any HTTP
runtime) has the same lifecycle, residents and health parts, built by `process_runtime`
around its own reading; the model its process holds is one `ProcessModel`, shared by the
reading (a switch replaces it) and the lifecycle (an answer, an exit or the unit's own
command line changes it).
"""

from __future__ import annotations

import shlex
from collections.abc import Callable

import aiohttp

from gpugate.config.model import Consumer
from gpugate.runtimes.answers import (
    Classified,
    HealthSignal,
    NotSupported,
    ReclaimRule,
    RouteKind,
)
from gpugate.runtimes.health import RouteHealth
from gpugate.runtimes.parts import Lifecycle, Memory, Reading, Residents
from gpugate.runtimes.process import ProcessControl
from gpugate.runtimes.process_supervised import SupervisedCommand
from gpugate.runtimes.process_systemd import SystemdUnit
from gpugate.runtimes.replies import ErrorReply
from gpugate.runtimes.runtime import ModelSettings, Runtime

PROCESS_MODEL = "<process>"
"""The name a process's memory goes by when nothing names its model."""
STOP_RECLAIM = ReclaimRule(recovered_fraction=1.0, consumer_clear=True)
"""A stopped process gives all its memory back, and leaves its consumer's row."""
UP_HEALTH = ErrorReply(200, b'{"status":"ok"}', "application/json")
"""whisper-server's 200 `{"status":"ok"}`, `application/json` (whisper.cpp v1.8.5
examples/server/server.cpp, the `/health` handler), the body llama-server answers too
(docs/runtimes/llamaserver.md)."""


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


class ProcessModel:
    """The model a process runtime's process holds: the one its command names when it
    starts, then the one a switch (whisper-server's /load) loaded."""

    def __init__(
        self, consumer: Consumer, *, options: tuple[str, ...] = (), default: str | None = None
    ) -> None:
        """`options`: the command's options that name the model (`-m`, `--model`);
        `default`: the model the program loads when its command names none."""
        self.consumer = consumer
        self.options = options
        self.default = default
        self.unit_command: tuple[str, ...] | None = None
        """The command line the unit runs (read from systemd), once the gate read it."""
        self.current = self.start_model()

    def start_model(self) -> str:
        """The model the process loads when it starts: its command's own option, else the
        consumer's only configured model, else the program's default."""
        model = self.commanded_model(*self.options) if self.options else None
        if model:
            return model
        if len(self.consumer.models) == 1:
            return self.consumer.models[0].name
        if self.default is not None and self.consumer.control is not None:
            return self.default
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


HealthAnswer = ErrorReply | Callable[[str], ErrorReply]
"""A runtime's answer on its health route once up: the same to every method, or by method."""


class ProcessLifecycle(Lifecycle):
    """The lifecycle every process runtime shares: its control, its model, its routes."""

    def __init__(
        self,
        model: ProcessModel,
        control: ProcessControl | None,
        *,
        needs_process: Callable[[str, str], bool] | None = None,
        up_health: HealthAnswer = UP_HEALTH,
        loaded_by: Callable[[Classified, int], bool] | None = None,
    ) -> None:
        """`needs_process`: the runtime's routes that run its process (None: all);
        `loaded_by`: its reading's rule for an answer that says a switch took effect."""
        self.model = model
        self.control = control
        self._needs = needs_process
        self._up_health = up_health
        self._loaded_by = loaded_by

    def process_model(self) -> str:
        return self.model.current

    def needs_process(self, method: str, path: str) -> bool:
        return self._needs is None or self._needs(method, path)

    def up_health(self, method: str = "GET") -> ErrorReply:
        answer = self._up_health
        return answer if isinstance(answer, ErrorReply) else answer(method)

    def answered(self, classified: Classified, status: int) -> None:
        # A switch of the running process's model took effect, by the rule the gate's
        # books follow too (`Reading.loaded_by`).
        loaded = self._loaded_by(classified, status) if self._loaded_by else status < 400
        if classified.kind is RouteKind.DEMAND and loaded and classified.model:
            self.model.current = classified.model

    def process_ended(self) -> None:
        # The next process starts with the model its command names.
        self.model.current = self.model.start_model()

    def read_unit_command(self, argv: list[str]) -> None:
        """The unit's own command line: the model it starts with is the one it names."""
        model = self.model
        before = model.start_model()
        model.unit_command = tuple(argv)
        if model.current == before:
            model.current = model.start_model()


class ProcessResidents(Residents):
    """A process's memory goes when it stops (the core's Stop, or Sleep): no unload."""

    def __init__(self, consumer: Consumer, rule: ReclaimRule, *, controlled: bool) -> None:
        self.consumer = consumer
        self.reclaim_rule = rule
        self.controlled = controlled

    async def evict(self, session: aiohttp.ClientSession, model: str) -> None:
        """A controlled process is evicted by its lifecycle; without a control it cannot be."""
        if not self.controlled:
            raise NotSupported(
                f"{self.consumer.name} has no control: the gate cannot stop it to free its memory"
            )
        raise NotSupported(f"{self.consumer.name} is evicted by stopping it, not by an unload")

    def evict_timeout(self) -> float:
        control = self.consumer.control
        stop = control.stop_timeout if control is not None else 0.0
        return stop + self.consumer.timeouts.control


def process_runtime(
    consumer: Consumer,
    reading: Reading,
    model: ProcessModel,
    *,
    control: ProcessControl | None,
    health_path: str,
    healthy: Callable[[int], bool] | None = None,
    unobserved: HealthSignal = HealthSignal.HEALTH_ROUTE,
    needs_process: Callable[[str, str], bool] | None = None,
    up_health: HealthAnswer = UP_HEALTH,
    reclaim_rule: ReclaimRule = STOP_RECLAIM,
    memory: Callable[[ModelSettings], Memory] = Memory,
) -> Runtime:
    """A process runtime's record around its own reading.

    Its health is its process's when the gate controls it (a stopped one is fine, a running
    one must answer `health_path`); without a control, `unobserved`: its health route, or
    nothing where nothing says where it answers. `memory` builds its memory part from its
    settings (by default: its configured envelope, no knob)."""
    signal = HealthSignal.PROCESS if control is not None else unobserved
    settings = ModelSettings(consumer, envelope=consumer.envelope)
    return Runtime(
        settings=settings,
        reading=reading,
        residents=ProcessResidents(consumer, reclaim_rule, controlled=control is not None),
        health=RouteHealth(signal, settings.url(health_path), healthy=healthy),
        memory=memory(settings),
        lifecycle=ProcessLifecycle(
            model,
            control,
            needs_process=needs_process,
            up_health=up_health,
            loaded_by=reading.loaded_by,
        ),
    )


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
