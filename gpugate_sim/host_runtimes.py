"""Starting the simulated host's runtimes that run as processes of their own: whisper-server,
vLLM and llama-server (a part of `SimulatedHost`)."""

from __future__ import annotations

import queue
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from gpugate_sim.children import Event, ReadyProcess
from gpugate_sim.scenario import HostSpec


class HostStartError(RuntimeError):
    """The simulated host could not start; the message says which part and why."""


class RuntimeStarters:
    """The runtimes of a host file that start as processes (a part of `SimulatedHost`)."""

    spec: HostSpec
    state_dir: Path | None
    events: queue.SimpleQueue[Event]
    output: TextIO
    ready_timeout: float
    whisper_url: str | None
    vllm_url: str | None
    llamaserver_url: str | None

    if TYPE_CHECKING:  # SimulatedHost provides these

        def _child_env(self) -> dict[str, str]: ...

        def _launch(self, child: ReadyProcess) -> None: ...

    def _start_whisper(self) -> None:
        from gpugate_sim.whisper.process import (
            WhisperStartError,
            wait_serving,
            whisper_argv,
            with_port,
        )
        from gpugate_sim.whisper.server import LISTENING

        assert self.state_dir is not None and self.spec.whisper is not None
        # Its "listening" line reaches a pipe only at its exit (C's stdout buffering): the
        # port is what says it is up.
        spec = with_port(self.spec.whisper)
        child = ReadyProcess(
            "whisper-server",
            whisper_argv(spec, self.state_dir),
            self.events,
            prefix=LISTENING,
            env=self._child_env(),
            own_group=True,
            output=self.output,
        )
        self._launch(child)
        assert child.popen is not None
        try:
            self.whisper_url = wait_serving(
                spec, child.popen.pid, child.popen.poll, self.ready_timeout
            )
        except WhisperStartError as exc:
            raise HostStartError(f"the simulated whisper-server did not start: {exc}") from None

    def _start_vllm(self) -> None:
        from gpugate_sim.vllm.process import (
            VllmStartError,
            vllm_argv,
            vllm_env,
            wait_serving,
            with_port,
        )

        assert self.state_dir is not None and self.spec.vllm is not None
        # It says it is up only in log lines; the port answering /health is what counts.
        spec = with_port(self.spec.vllm)
        child = ReadyProcess(
            "vllm",
            vllm_argv(spec, self.state_dir),
            self.events,
            env=vllm_env(spec, self._child_env()),
            own_group=True,
            output=self.output,
        )
        self._launch(child)
        assert child.popen is not None
        try:
            self.vllm_url = wait_serving(
                spec, child.popen.pid, child.popen.poll, self.ready_timeout
            )
        except VllmStartError as exc:
            raise HostStartError(f"the simulated vllm serve did not start: {exc}") from None

    def _start_llamaserver(self) -> None:
        # It binds before it loads: /health answering 200 is what says it is up.
        from gpugate_sim.llamaserver.process import (
            LlamaServerStartError,
            llamaserver_argv,
            wait_healthy,
        )
        from gpugate_sim.whisper.process import with_port

        assert self.state_dir is not None and self.spec.llamaserver is not None
        spec = with_port(self.spec.llamaserver)  # type: ignore[arg-type]
        child = ReadyProcess(
            "llama-server",
            llamaserver_argv(spec, self.state_dir),
            self.events,
            prefix="\0",
            env=self._child_env(),
            own_group=True,
            output=self.output,
        )
        self._launch(child)
        assert child.popen is not None
        try:
            self.llamaserver_url = wait_healthy(spec, child.popen, self.ready_timeout)  # type: ignore[arg-type]
        except LlamaServerStartError as exc:
            raise HostStartError(f"the simulated llama-server did not start: {exc}") from None
