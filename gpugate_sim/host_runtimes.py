"""Starting the simulated host's runtimes that run as processes of their own: whisper-server,
vLLM and llama-server (a part of `SimulatedHost`)."""

from __future__ import annotations

import queue
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from gpugate_sim.children import READY, Event, ReadyProcess
from gpugate_sim.scenario import HostSpec
from gpugate_sim.serverprocess import Launch, ServerStartError, wait_serving, with_port


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
        from gpugate_sim.whisper.process import SECTION, whisper_launch
        from gpugate_sim.whisper.server import LISTENING

        assert self.state_dir is not None and self.spec.whisper is not None
        # Its "listening" line reaches a pipe only at its exit (C's stdout buffering): the
        # port is what says it is up.
        spec = with_port(self.spec.whisper, SECTION)
        launch = whisper_launch(spec, self.state_dir, self._child_env())
        self.whisper_url = self._start_server("whisper-server", launch, LISTENING)

    def _start_vllm(self) -> None:
        from gpugate_sim.vllm.process import SECTION, vllm_launch

        assert self.state_dir is not None and self.spec.vllm is not None
        # It says it is up only in log lines; the port answering /health is what counts.
        spec = with_port(self.spec.vllm, SECTION)
        launch = vllm_launch(spec, self.state_dir, self._child_env())
        self.vllm_url = self._start_server("vllm", launch)

    def _start_llamaserver(self) -> None:
        from gpugate_sim.llamaserver.process import SECTION, llamaserver_launch

        assert self.state_dir is not None and self.spec.llamaserver is not None
        # It binds before it loads: /health answering 200 is what says it is up.
        spec = with_port(self.spec.llamaserver, SECTION)
        launch = llamaserver_launch(spec, self.state_dir, self._child_env())
        self.llamaserver_url = self._start_server("llama-server", launch, "\0")

    def _start_server(self, label: str, launch: Launch, prefix: str = READY) -> str:
        """Run `launch` as a child of the host (its output behind `[label]`); its URL once
        it serves. `prefix` begins the line it prints when ready, if it prints one."""
        child = ReadyProcess(
            label,
            launch.argv,
            self.events,
            prefix=prefix,
            env=launch.env,
            own_group=True,
            output=self.output,
        )
        self._launch(child)
        assert child.popen is not None
        try:
            return wait_serving(launch, child.popen.pid, child.popen.poll, self.ready_timeout)
        except ServerStartError as exc:
            raise HostStartError(f"the simulated {launch.program} did not start: {exc}") from None
