"""The simulated ComfyUI server: lifecycle, the process that holds its VRAM, test API."""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

from aiohttp import web

import gpugate_sim.comfyui.origin as origin
from gpugate.core.units import GiB
from gpugate_sim.comfyui.executor import Executor
from gpugate_sim.comfyui.hub import Hub
from gpugate_sim.comfyui.memory import MemoryOptions, Vram, reserve_bytes
from gpugate_sim.comfyui.nodes import node_table
from gpugate_sim.comfyui.nodetypes import input_listing
from gpugate_sim.comfyui.promptqueue import PromptQueue
from gpugate_sim.comfyui.record import PromptRecords
from gpugate_sim.comfyui.routes import Routes
from gpugate_sim.comfyui.validation import annotated_exists
from gpugate_sim.cuda import NO_DEVICE_TORCH, VISIBLE_ENV, parse_visible
from gpugate_sim.device import SimulatedGpuHost
from gpugate_sim.holder import holder_argv, set_cmdline, set_comm
from gpugate_sim.scenario import ComfyUISpec, HolderSpec
from gpugate_sim.serverprocess import child_env

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
PROCESS_NAME = "python3"
SHUTDOWN_GRACE = 1.0


def split_listen(listen: str) -> tuple[str, int]:
    """Split HOST:PORT: "127.0.0.1:8188" -> ("127.0.0.1", 8188)."""
    host, sep, port = listen.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"comfyui.listen: expected HOST:PORT, got {listen!r}")
    return host.strip("[]") or "127.0.0.1", int(port)


def comfyui_argv(
    host: str, port: int, cuda_device: int | None = None, memory: tuple[str, ...] = ()
) -> list[str]:
    """The command line the process shows, as a ComfyUI started from its checkout."""
    argv = [PROCESS_NAME, "ComfyUI/main.py", "--listen", host, "--port", str(port)]
    if cuda_device is not None:
        argv += ["--cuda-device", str(cuda_device)]
    return argv + list(memory)


def memory_flags(spec: ComfyUISpec) -> tuple[str, ...]:
    """The memory options of `spec` as ComfyUI's command line gives them."""
    flags: list[str] = []
    if spec.reserve_vram is not None:
        flags += ["--reserve-vram", f"{spec.reserve_vram:g}"]
    if spec.dynamic_vram:
        flags.append("--enable-dynamic-vram")
    if spec.vram_headroom:
        flags += ["--vram-headroom", f"{spec.vram_headroom:g}"]
    if spec.disable_smart_memory:
        flags.append("--disable-smart-memory")
    return tuple(flags)


def memory_options(spec: ComfyUISpec) -> MemoryOptions:
    """How the process uses the card, from its options (comfy/model_management.py
    `EXTRA_RESERVED_VRAM`, `DISABLE_SMART_MEMORY`; main.py's comfy-aimdo start)."""
    return MemoryOptions(
        reserve=reserve_bytes(spec.reserve_vram),
        reserve_given=spec.reserve_vram is not None,
        dynamic=spec.dynamic_vram,
        headroom=int(spec.vram_headroom * GiB),
        smart_memory=not spec.disable_smart_memory,
    )


class NoCudaDevice(RuntimeError):
    """PyTorch sees no CUDA device: ComfyUI stops at start (a traceback ending in this)."""

    def __init__(self) -> None:
        super().__init__(NO_DEVICE_TORCH.removeprefix("RuntimeError: "))


def cuda_device(spec: ComfyUISpec, gpu: SimulatedGpuHost, environ: Mapping[str, str]) -> int:
    """The host GPU that is ComfyUI's `cuda:0`; NoCudaDevice when it sees none.

    main.py sets CUDA_VISIBLE_DEVICES to `--cuda-device N` before PyTorch starts, so N is
    a host GPU whatever the environment said; without it the inherited variable decides.
    """
    value = str(spec.gpu) if spec.gpu is not None else environ.get(VISIBLE_ENV)
    device = parse_visible(value, gpu.read().devices).host_gpu(0)
    if device is None:
        raise NoCudaDevice()
    return device


class SimComfyUI:
    """A simulated ComfyUI: the aiohttp app, its prompt worker, and its VRAM.

    With `pid=None` (tests in one process) a child process named `python3` with ComfyUI's
    command line holds the CUDA context, and every allocation is made under its PID; with
    `pid=os.getpid()` (`python -m gpugate_sim.comfyui serve`, which takes that name
    itself) the server's own process holds them, as a real ComfyUI does.
    """

    def __init__(
        self,
        spec: ComfyUISpec,
        gpu: SimulatedGpuHost,
        *,
        pid: int | None = None,
        data_dir: Path | None = None,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        self.spec = spec
        self.gpu = gpu
        self.environ = os.environ if environ is None else environ
        self.device = 0
        """The host GPU it runs on (its `cuda:0`), known once started."""
        self.data_dir = data_dir or gpu.directory / "comfyui"
        self.output_dir = (self.data_dir / "output").resolve()
        self.input_dir = (self.data_dir / "input").resolve()
        self.temp_dir = (self.data_dir / "temp").resolve()
        self.client_max_size = round(spec.max_upload_size * 1024 * 1024)
        self.server_features: dict[str, Any] = {
            "supports_preview_metadata": True,
            "max_upload_size": spec.max_upload_size * 1024 * 1024,
        }
        self.number = 0
        self.url: str | None = None
        self.argv: list[str] = []
        self._own_pid = pid
        self._holder: asyncio.subprocess.Process | None = None
        self.hub = Hub(self.server_features)
        self.queue = PromptQueue(self._queue_updated)
        self.vram = Vram(
            gpu, 0, pid or 0,
            load_seconds_per_gib=spec.load_seconds_per_gib, options=memory_options(spec),
        )  # fmt: skip
        self.nodes = node_table(spec.custom_nodes)
        """The classes it knows: ComfyUI's own, then its custom node packs'."""
        self.executor = Executor(
            spec, self.queue, self.hub, self.vram, self.output_dir, self.temp_dir
        )
        self._worker: asyncio.Task[None] | None = None
        self.prompt_records: PromptRecords | None = None
        """Where `POST /prompt` answers are recorded (`comfyui.record`), once started."""
        self._runner: web.AppRunner | None = None
        self.app = self._build_app()

    def _build_app(self) -> web.Application:
        check = (
            origin.cors(self.spec.enable_cors_header)
            if self.spec.enable_cors_header
            else origin.origin_only
        )
        app = web.Application(
            client_max_size=self.client_max_size, middlewares=[check, _empty_not_found]
        )
        app.router.add_routes(Routes(self).table())
        return app

    # -- what routes read ----------------------------------------------------------------------

    def queue_info(self) -> dict[str, Any]:
        return {"exec_info": {"queue_remaining": self.queue.tasks_remaining()}}

    def _queue_updated(self) -> None:
        self.hub.send_sync("status", {"status": self.queue_info()})

    def files(self, folder: str) -> list[str]:
        """The host's model files in `folder`, sorted as get_filename_list sorts them."""
        return sorted(m.name for m in self.spec.models if m.folder == folder)

    def file_lists(self) -> dict[str, list[str]]:
        lists = {folder: self.files(folder) for folder in {m.folder for m in self.spec.models}}
        lists.update(input_listing(self.input_dir))
        return lists

    def exists(self, name: str) -> bool:
        """folder_paths `exists_annotated_filepath` over its input, output and temp folders."""
        folders = {"input": self.input_dir, "output": self.output_dir, "temp": self.temp_dir}
        return annotated_exists(folders)(name)

    @property
    def pid(self) -> int:
        """The process whose VRAM is ComfyUI's."""
        return self.vram.pid

    # -- lifecycle -----------------------------------------------------------------------------

    async def start(self, host: str | None = None, port: int | None = None) -> str:
        """Listen (default: the spec's `listen`), take the CUDA context, start the worker."""
        spec_host, spec_port = split_listen(self.spec.listen)
        host = spec_host if host is None else host
        port = spec_port if port is None else port
        self.device = self.vram.index = cuda_device(self.spec, self.gpu, self.environ)
        for directory in (self.output_dir, self.input_dir, self.temp_dir):
            directory.mkdir(parents=True, exist_ok=True)
        if self.spec.record is not None and self.prompt_records is None:
            self.prompt_records = PromptRecords(self.spec.record)
        self.hub.start()
        self._runner = web.AppRunner(
            self.app, handler_cancellation=True, shutdown_timeout=SHUTDOWN_GRACE, access_log=None
        )
        try:
            await self._runner.setup()
            await web.TCPSite(self._runner, host, port).start()
            bound = self._runner.addresses[0]
            shown = f"[{bound[0]}]" if ":" in bound[0] else bound[0]
            self.url = f"http://{shown}:{bound[1]}"
            self.argv = comfyui_argv(host, int(bound[1]), self.spec.gpu, memory_flags(self.spec))
            await self._take_context()
            self._worker = asyncio.ensure_future(self.executor.worker())
        except BaseException:
            await self.close()
            raise
        return self.url

    async def _take_context(self) -> None:
        if self._own_pid is not None:
            if self._own_pid == os.getpid():
                # Named before the first allocation: attribution reads a GPU process once.
                set_comm(PROCESS_NAME)
                set_cmdline(self.argv)
            self.vram.pid = self._own_pid
            self.vram.create_context(self.spec.context)
            return
        spec = HolderSpec(PROCESS_NAME, self.spec.context, self.device, tuple(self.argv))
        self._holder = await asyncio.create_subprocess_exec(
            *holder_argv(spec, self.gpu.directory),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            env=child_env(),
        )
        assert self._holder.stdout is not None
        line = await self._holder.stdout.readline()
        if not line.startswith(b"READY"):
            code = await self._holder.wait()
            raise RuntimeError(
                f"the ComfyUI process exited with {code} before holding its "
                f"CUDA context ({self.spec.context} bytes)"
            )
        self.vram.pid = self._holder.pid
        self.vram.context = self.spec.context

    async def close(self) -> None:
        """Stop serving and the worker, and give the process's VRAM back."""
        if self._worker is not None:
            self._worker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._worker
            self._worker = None
        await self.hub.close()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if self._holder is not None:
            with contextlib.suppress(ProcessLookupError):
                self._holder.terminate()
            await self._holder.wait()
            self._holder = None
        elif self.vram.pid:
            self.vram.release_all()
        if self.prompt_records is not None:
            self.prompt_records.close()
            self.prompt_records = None

    async def __aenter__(self) -> SimComfyUI:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def wait_until(self, predicate: Callable[[], bool], timeout: float = 10.0) -> None:
        """Wait (on the worker's progress, not a clock) until `predicate()` holds."""
        async with asyncio.timeout(timeout):
            async with self.executor.changed:
                await self.executor.changed.wait_for(predicate)


@web.middleware
async def _empty_not_found(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Unknown paths fall through to the static route upstream: 404 with an empty body."""
    try:
        return await handler(request)
    except web.HTTPNotFound:
        return web.Response(status=404)
