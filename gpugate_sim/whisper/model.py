"""The whisper context: a model's VRAM on the simulated GPU, taken and freed like whisper.cpp.

`whisper_init_from_file_with_params` allocates the weights, reads them, then builds the
state (KV caches and compute buffers); the server only binds its port afterwards. Here
the weights (all but `STATE_SHARE` of the model's bytes) are allocated at once, the rest
after the load time. A part that does not fit fails as ggml-cuda reports it; what the
process then does (abort, or whisper-server's own `return 3`) is the caller's choice.

A file is a model when it is one of the catalog's (the simulated disk) or a real file that
whisper.cpp would load (ggml.py); anything else that opens — another file, a directory, a
model cut short — passes `is_file_exist` in server.cpp but fails `whisper_model_load`.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TextIO

import attrs

from gpugate.core.units import MiB
from gpugate_sim.device import GpuOutOfMemory, SimulatedGpuHost
from gpugate_sim.whisper.ggml import BadModel, ModelFile, read_model

PROCESS_NAME = "whisper-server"
STATE_SHARE = 8
"""1/STATE_SHARE of a model's bytes is its state (KV caches, compute buffers)."""


class ModelMissing(Exception):
    """No such model file (neither on the simulated disk nor on the real one)."""


class NotAModel(Exception):
    """The path opens (a file or a directory) but holds no model whisper.cpp loads."""

    def __init__(self, path: str, line: str) -> None:
        super().__init__(path)
        self.line = line
        """What whisper_model_load logs about it."""


class ModelDoesNotFit(Exception):
    """A part of the context could not be allocated; the lines ggml/whisper.cpp print."""

    def __init__(self, lines: list[str]) -> None:
        super().__init__("\n".join(lines))
        self.lines = lines


@attrs.frozen
class ModelCatalog:
    """Model files the simulated disk holds: path (or file name) → VRAM of a loaded context."""

    sizes: Mapping[str, int] = attrs.field(factory=dict)

    def size(self, path: str) -> int:
        """The VRAM `path` takes once loaded; ModelMissing when there is no such file,
        NotAModel when it opens but is no model."""
        return self.model(path).size

    def model(self, path: str) -> ModelFile:
        """The model at `path`: the catalog's (English-only when its file name says `.en`),
        else the real file's, read as whisper_model_load reads it (ggml.py)."""
        for key in (path, os.path.basename(path)):
            if key in self.sizes:
                return ModelFile(self.sizes[key], is_multilingual(path))
        if Path(path).is_dir():
            raise NotAModel(path, "whisper_model_load: invalid model data (bad magic)")
        try:
            return read_model(path)
        except BadModel as exc:
            raise NotAModel(path, str(exc)) from None
        except OSError:
            raise ModelMissing(path) from None

    def exists(self, path: str) -> bool:
        """`is_file_exist` of the server: whether `std::ifstream(path)` opens (a directory
        does; a named pipe waits for a writer)."""
        if any(key in self.sizes for key in (path, os.path.basename(path))):
            return True
        if not path:
            return False
        try:
            os.close(os.open(path, os.O_RDONLY))
        except OSError:
            return False
        return True


def is_multilingual(path: str) -> bool:
    """Whether a catalog model is multilingual: English-only ones are named `*.en*`."""
    return ".en" not in os.path.basename(path)


class Context:
    """The one loaded model of a whisper-server process, held under this process's PID."""

    def __init__(
        self,
        gpu_host: SimulatedGpuHost,
        catalog: ModelCatalog,
        *,
        gpu: int | None = 0,
        ordinal: int | None = None,
        load_seconds: float = 0.0,
        err: TextIO = sys.stderr,
    ) -> None:
        self.gpu_host = gpu_host
        self.catalog = catalog
        self.gpu = gpu
        """The host GPU the model goes to; None: the CPU (no CUDA device for it)."""
        self.ordinal = (gpu or 0) if ordinal is None else ordinal
        """The CUDA device it asked for (`-dev`), as its log lines name it."""
        self.load_seconds = load_seconds
        self.err = err
        self.pid = os.getpid()
        self.model: str | None = None
        self._multilingual = False
        self.held = 0

    def init(self, path: str, sleep: bool = True) -> None:
        """Load `path` (blocking: the server does nothing else meanwhile at startup).

        Raises ModelMissing or ModelDoesNotFit; nothing stays allocated after a failure.
        """
        self._say(f"whisper_init_from_file_with_params_no_state: loading model from '{path}'")
        try:
            found = self.catalog.model(path)
        except ModelMissing:
            self._say(f"whisper_init_from_file_with_params_no_state: failed to open '{path}'")
            raise
        except NotAModel as exc:
            self._say_init()
            self._say("whisper_model_load: loading model")
            self._say(exc.line)
            self._say("whisper_init_with_params_no_state: failed to load model")
            raise
        size = found.size
        weights = size - size // STATE_SHARE
        self._say_init()
        self._allocate(weights, [
            "whisper_model_load: failed to allocate memory for the model",
            "whisper_init_with_params_no_state: failed to load model",
        ])  # fmt: skip
        buffer = "CPU" if self.gpu is None else f"CUDA{self.ordinal}"
        self._say(f"whisper_model_load: {buffer:>8} total size = {weights / 1e6:8.2f} MB")
        if sleep and self.load_seconds:
            time.sleep(self.load_seconds)
        self._allocate(size - weights, [
            "whisper_kv_cache_init: failed to allocate memory for the kv cache",
            "whisper_init_state: whisper_kv_cache_init() failed for self-attention cache",
        ])  # fmt: skip
        self._say(f"whisper_init_state: kv self size  = {(size - weights) / 1e6:7.2f} MB")
        self.model = path
        self._multilingual = found.multilingual

    @property
    def multilingual(self) -> bool:
        """`whisper_is_multilingual` of the loaded model."""
        return self.model is not None and self._multilingual

    def free(self) -> None:
        """`whisper_free`: the VRAM goes back at once."""
        if self.held:
            self.gpu_host.release(self.pid, gpu=self.gpu)
        self.held = 0
        self.model = None

    def _allocate(self, nbytes: int, then: list[str]) -> None:
        if self.gpu is None:
            return  # in system memory: nothing on any GPU
        try:
            self.gpu_host.allocate(self.pid, nbytes, gpu=self.gpu, name=PROCESS_NAME)
        except GpuOutOfMemory:
            lines = [
                f"ggml_backend_cuda_buffer_type_alloc_buffer: allocating {nbytes / MiB:.2f} MiB "
                f"on device {self.ordinal}: cudaMalloc failed: out of memory",
                *then,
            ]
            self.free()
            raise ModelDoesNotFit(lines) from None
        self.held += nbytes

    def _say_init(self) -> None:
        self._say("whisper_init_with_params_no_state: use gpu    = 1")
        self._say(f"whisper_init_with_params_no_state: gpu_device = {self.ordinal}")
        if self.gpu is None:
            # whisper_backend_init_gpu: no GPU with that index among those CUDA shows, so
            # the model is loaded for the CPU.
            self._say("whisper_backend_init_gpu: no GPU found")

    def _say(self, line: str) -> None:
        self.err.write(line + "\n")
        self.err.flush()
