"""Run a simulated GPU host: `gpugate sim run HOST.yaml`.

A running host is a state directory (the device state the fake NVML library serves), one
process per holder (children started by their parent holder, so /proc ancestry is real)
and, when HOST.yaml has an `ollama:` section, a simulated Ollama. Once everything is ready
`gpugate sim run` prints the environment a gate needs and stays in the foreground::

    GPUGATE_FAKE_NVML_STATE=/tmp/gpugate-sim-x1y2/nvml.state
    LD_LIBRARY_PATH=/src/gpugate/build/fakenvml
    GPUGATE_NVML_LIBRARY=/src/gpugate/build/fakenvml/libnvidia-ml.so.1
    # simulated host ready: 1 GPU(s), 3 holder(s), ollama at http://127.0.0.1:11435

SIGTERM or SIGINT stops every process it started and removes a temporary state directory.

From Python: `SimulatedHost` runs a host inside the calling process (its processes are the
caller's children); `SimulatedHostProcess` runs `gpugate sim run` as a child and reads
the environment it prints.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import queue
import shutil
import signal
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import TextIO

import attrs

from gpugate_sim.children import (
    DEFAULT_READY_TIMEOUT,
    DEFAULT_STOP_GRACE,
    ChildFailed,
    Event,
    Exited,
    ReadyProcess,
    Stopped,
    StopRequested,
    describe_exit,
    install_stop_handlers,
    stop_all,
)
from gpugate_sim.device import SimDevice, SimulatedGpuHost
from gpugate_sim.holder import count_holders, holder_argv
from gpugate_sim.host_runtimes import HostStartError, RuntimeStarters
from gpugate_sim.reaping import become_subreaper, clear_groups, reap_orphans
from gpugate_sim.scenario import HolderSpec, HostSpec, ScenarioError, load_host
from gpugate_sim.shim import STATE_ENV, library_path

LIBRARY_ENV = "GPUGATE_NVML_LIBRARY"
"""The gate loads this file as libnvidia-ml.so.1 when set (pynvml itself has no override)."""
READY_COMMENT = "# simulated host ready:"
OLLAMA_MODULE = "gpugate_sim.ollama"
OLLAMA_READY_TIMEOUT = 60.0
COMFYUI_MODULE = "gpugate_sim.comfyui"
EXIT_BAD_HOST_FILE = 2

_UUID_NAMESPACE = uuid.UUID("3f8e2c1a-6d4b-4e59-9a71-0c2d5b8e4f60")


def default_gpu_uuid(index: int) -> str:
    """A stable UUID for simulated GPU `index`, in NVML's `GPU-...` form."""
    return f"GPU-{uuid.uuid5(_UUID_NAMESPACE, f'simulated-gpu-{index}')}"


@attrs.frozen
class HostEnvironment:
    """What a process needs in its environment to see a simulated host through NVML."""

    state_path: Path
    library_path: Path

    def variables(self) -> dict[str, str]:
        """The variables as `gpugate sim run` prints them."""
        return {
            STATE_ENV: str(self.state_path),
            "LD_LIBRARY_PATH": str(self.library_path.parent),
            LIBRARY_ENV: str(self.library_path),
        }

    def lines(self) -> list[str]:
        return [f"{name}={value}" for name, value in self.variables().items()]

    def apply(self, base: dict[str, str] | None = None) -> dict[str, str]:
        """`base` (default: this process's environment) with these variables set."""
        env = dict(os.environ if base is None else base)
        previous = env.get("LD_LIBRARY_PATH")
        env.update(self.variables())
        if previous:
            env["LD_LIBRARY_PATH"] = f"{self.library_path.parent}:{previous}"
        return env

    @classmethod
    def from_lines(cls, lines: Sequence[str]) -> HostEnvironment:
        """Read the variables back from `gpugate sim run` output."""
        values = dict(line.split("=", 1) for line in lines if "=" in line)
        try:
            return cls(Path(values[STATE_ENV]), Path(values[LIBRARY_ENV]))
        except KeyError as exc:
            raise ValueError(f"no {exc.args[0]}= line in {list(lines)!r}") from None


@attrs.frozen
class RunningHolder:
    """A top-level holder process."""

    name: str
    pid: int
    holders: int
    """Processes in its tree that hold VRAM: itself and its children."""


class SimulatedHost(RuntimeStarters):
    """A simulated host run by this process: start() it, use environment, stop() it.

    Usable as a context manager. Holders and the simulated Ollama each get their own
    process group, so stop() reaches their children too. start() makes this process a child
    subreaper, so a grandchild whose parent had to be killed is handed to it and reaped
    rather than left a zombie. Holders exit when the thread that started them ends
    (PR_SET_PDEATHSIG follows the thread): call start() from a thread that outlives the
    host, such as the main thread.
    """

    def __init__(
        self,
        spec: HostSpec,
        state_dir: Path | None = None,
        *,
        ready_timeout: float = DEFAULT_READY_TIMEOUT,
        ollama_ready_timeout: float = OLLAMA_READY_TIMEOUT,
        ollama_command: Sequence[str] | None = None,
        output: TextIO | None = None,
    ) -> None:
        self.spec = spec
        self._given_state_dir = state_dir
        self.ready_timeout = ready_timeout
        self.ollama_ready_timeout = ollama_ready_timeout
        self.ollama_command = (
            list(ollama_command)
            if ollama_command is not None
            else [sys.executable, "-m", OLLAMA_MODULE, "serve"]
        )
        self.output = output if output is not None else sys.stderr
        self.events: queue.SimpleQueue[Event] = queue.SimpleQueue()
        self.state_dir: Path | None = None
        self.gpu: SimulatedGpuHost | None = None
        self.environment: HostEnvironment | None = None
        self.holders: list[RunningHolder] = []
        self.ollama_url: str | None = None
        self.whisper_url: str | None = None
        self.comfyui_url: str | None = None
        self.vllm_url: str | None = None
        self.llamaserver_url: str | None = None
        self._processes: list[ReadyProcess] = []
        self._stopping = False

    # -- lifecycle -----------------------------------------------------------------------------

    def start(self) -> SimulatedHost:
        """Create the state, start holders (then Ollama) and wait until each is ready.

        Raises HostStartError (after cleaning up) when a part fails, or Stopped when
        request_stop() is called meanwhile.
        """
        become_subreaper()
        try:
            self._create_state()
            for spec in self.spec.holders:
                self._start_holder(spec)
            if self.spec.whisper is not None:
                self._start_whisper()
            if self.spec.vllm is not None:
                self._start_vllm()
            if self.spec.ollama is not None:
                self._start_ollama()
            if self.spec.comfyui is not None:
                self._start_comfyui()
            if self.spec.llamaserver is not None:
                self._start_llamaserver()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self, grace: float = DEFAULT_STOP_GRACE) -> None:
        """Stop every process this host started, reap them, remove a temporary state dir."""
        self._stopping = True
        groups = {p.pid for p in self._processes if p.popen is not None}
        stop_all(self._processes, grace)
        self._processes = []
        clear_groups(groups, grace)
        if self._given_state_dir is None and self.state_dir is not None:
            shutil.rmtree(self.state_dir, ignore_errors=True)

    def request_stop(self, signum: int = signal.SIGTERM) -> None:
        """Ask wait() (or a start() in progress) to return; safe in a signal handler."""
        self.events.put(StopRequested(signum))

    def wait(self) -> None:
        """Block until request_stop(), reporting holders that exit on their own."""
        while True:
            event = self.events.get()
            if isinstance(event, StopRequested):
                return
            if isinstance(event, Exited) and not self._stopping:
                code = event.child.wait(timeout=DEFAULT_STOP_GRACE)
                self._say(f"{event.child.label} (pid {event.child.pid}) exited with "
                          f"{describe_exit(code)}")  # fmt: skip

    def __enter__(self) -> SimulatedHost:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # -- describing it -------------------------------------------------------------------------

    @property
    def pids(self) -> list[int]:
        """PIDs of the processes this host started directly (holders and Ollama)."""
        return [p.pid for p in self._processes]

    def ready_line(self) -> str:
        """The comment `gpugate sim run` ends its announcement with."""
        line = (
            f"{READY_COMMENT} {len(self.spec.gpus)} GPU(s), "
            f"{count_holders(self.spec.holders)} holder(s)"
        )
        if self.ollama_url is not None:
            line += f", ollama at {self.ollama_url}"
        if self.whisper_url is not None:
            line += f", whisper-server at {self.whisper_url}"
        if self.vllm_url is not None:
            line += f", vllm at {self.vllm_url}"
        if self.comfyui_url is not None:
            line += f", comfyui at {self.comfyui_url}"
        if self.llamaserver_url is not None:
            line += f", llama-server at {self.llamaserver_url}"
        return line

    # -- starting the parts --------------------------------------------------------------------

    def _create_state(self) -> None:
        if self._given_state_dir is None:
            self.state_dir = Path(tempfile.mkdtemp(prefix="gpugate-sim-"))
        else:
            self.state_dir = self._given_state_dir.resolve()
        try:
            devices = [
                SimDevice(
                    index=i,
                    total=gpu.total,
                    reserved=gpu.reserved,
                    uuid=gpu.uuid or default_gpu_uuid(i),
                    name=gpu.name,
                    base_used=gpu.base_used,
                )
                for i, gpu in enumerate(self.spec.gpus)
            ]
        except ValueError as exc:
            raise HostStartError(f"{self._source()}: gpus: {exc}") from None
        try:
            self.gpu = SimulatedGpuHost.create(
                self.state_dir, devices, driver=self.spec.driver, cuda=self.spec.cuda
            )
        except OSError as exc:
            raise HostStartError(
                f"cannot create the device state in {self.state_dir}: {exc}"
            ) from None
        try:
            shim = library_path()
        except (OSError, RuntimeError, subprocess.CalledProcessError) as exc:
            raise HostStartError(f"cannot build the fake NVML library: {exc}") from None
        self.environment = HostEnvironment(self.gpu.state_path.resolve(), shim.resolve())

    def _child_env(self) -> dict[str, str]:
        assert self.environment is not None
        return self.environment.apply()

    def _start_holder(self, spec: HolderSpec) -> None:
        assert self.state_dir is not None
        child = ReadyProcess(
            f"holder {spec.name}",
            holder_argv(spec, self.state_dir),
            self.events,
            env=self._child_env(),
            own_group=True,
            output=self.output,
        )
        self._launch(child)
        try:
            child.wait_ready(self.ready_timeout)
        except ChildFailed as exc:
            raise HostStartError(
                f"holder {spec.name!r} ({spec.bytes} bytes on GPU {spec.gpu}) did not start: "
                f"{exc.reason}"
            ) from None
        self.holders.append(RunningHolder(spec.name, child.pid, count_holders([spec])))

    def _start_ollama(self) -> None:
        assert self.state_dir is not None and self.spec.ollama is not None
        if self.spec.source is None:
            raise HostStartError("the simulated Ollama reads HOST.yaml, and this host has no file")
        if self.ollama_command[1:3] == ["-m", OLLAMA_MODULE] and not _module_exists(OLLAMA_MODULE):
            raise HostStartError(
                f"{self.spec.source}: has an ollama: section, but {OLLAMA_MODULE} is not installed"
            )
        child = ReadyProcess(
            "ollama",
            [*self.ollama_command, "--host-file", str(self.spec.source.resolve()),
             "--state-dir", str(self.state_dir)],
            self.events,
            env=self._child_env(),
            own_group=True,
            output=self.output,
        )  # fmt: skip
        self._launch(child)
        try:
            line = child.wait_ready(self.ollama_ready_timeout)
        except ChildFailed as exc:
            raise HostStartError(f"the simulated Ollama did not start: {exc}") from None
        urls = [word for word in line.split() if word.startswith(("http://", "https://"))]
        self.ollama_url = urls[0] if urls else f"http://{self.spec.ollama.listen}"

    def _start_comfyui(self) -> None:
        # One process, as a real ComfyUI: it takes ComfyUI's command line and holds its VRAM.
        assert self.state_dir is not None and self.spec.comfyui is not None
        if self.spec.source is None:
            raise HostStartError("the simulated ComfyUI reads HOST.yaml, and this host has no file")
        child = ReadyProcess(
            "comfyui",
            [sys.executable, "-m", COMFYUI_MODULE, "serve",
             "--host-file", str(self.spec.source.resolve()), "--state-dir", str(self.state_dir)],
            self.events,
            env=self._child_env(),
            own_group=True,
            output=self.output,
        )  # fmt: skip
        self._launch(child)
        try:
            line = child.wait_ready(self.ollama_ready_timeout)
        except ChildFailed as exc:
            raise HostStartError(f"the simulated ComfyUI did not start: {exc}") from None
        urls = [word for word in line.split() if word.startswith(("http://", "https://"))]
        self.comfyui_url = urls[0] if urls else f"http://{self.spec.comfyui.listen}"

    def _launch(self, child: ReadyProcess) -> None:
        try:
            child.start()
        except OSError as exc:
            raise HostStartError(f"cannot start {child.label}: {exc}") from None
        self._processes.append(child)

    def _source(self) -> str:
        return str(self.spec.source) if self.spec.source is not None else "HOST.yaml"

    def _say(self, line: str) -> None:
        with contextlib.suppress(OSError, ValueError):
            self.output.write(f"simulated host: {line}\n")
            self.output.flush()


def _module_exists(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ImportError:
        return False


def run_host(host_file: Path, state_dir: Path | None = None) -> int:
    """`gpugate sim run`: start the host, print its environment, run until SIGTERM/SIGINT."""
    try:
        spec = load_host(host_file)
    except ScenarioError as exc:
        print(f"gpugate sim run: {exc}", file=sys.stderr)
        return EXIT_BAD_HOST_FILE
    except ImportError as exc:
        # Reading an `ollama:` section needs the simulated Ollama's own package.
        print(f"gpugate sim run: {host_file}: cannot read the ollama: section: {exc}",
              file=sys.stderr)  # fmt: skip
        return EXIT_BAD_HOST_FILE
    host = SimulatedHost(spec, state_dir)
    install_stop_handlers(host.events)
    try:
        host.start()
    except HostStartError as exc:
        print(f"gpugate sim run: {exc}", file=sys.stderr)
        reap_orphans()
        return 1
    except Stopped:
        reap_orphans()
        return 0
    try:
        assert host.environment is not None
        for line in [*host.environment.lines(), host.ready_line()]:
            print(line)
        sys.stdout.flush()
        host.wait()
    except BrokenPipeError:
        # Whoever read the environment has gone; stop, and keep the exit quiet.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    finally:
        host.stop()
        reap_orphans()
    return 0
