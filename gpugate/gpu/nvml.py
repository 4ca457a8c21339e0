"""NVML through pynvml: the only module of gpugate that imports it.

`NvmlReader.read()` returns one synchronous sample of every device as plain records. The
calls block in driver ioctls and take the driver's global lock, so callers run them in a
worker thread, never on an event loop.

NVML is initialised once per process however many readers exist (a reference count of
ours, under a lock); the last `close()` shuts it down and a later `open()` initialises
it again. An explicit library (`gate.nvml_library`, else `$GPUGATE_NVML_LIBRARY`) is
installed into pynvml before that first initialisation, since pynvml itself only ever
opens `libnvidia-ml.so.1` by name.

Error policy: every failure is an `NvmlError` carrying the NVML code, pynvml's class
name, the C function that failed and a message; nothing else escapes (pynvml's
`NVMLLibraryMismatchError` is not an `NVMLError` and is converted as well).

* Fallbacks, not failures: `nvmlDeviceGetMemoryInfo_v2` answering FunctionNotFound,
  NotSupported or ArgumentVersionMismatch (drivers before 510) → v1, which has no
  `reserved`: reserved is 0 and used is v1's used (which includes the reserved part).
  `…RunningProcesses_v3` missing → the `_v2` call.
* Per device, degraded: a process list that is not available (NotSupported,
  NoPermission, FunctionNotFound/library mismatch, ArgumentVersionMismatch, or a list
  that grew beyond pynvml's buffer between its two calls) → the device is reported with
  the processes of the other list, if any, and `process_fault` says what is missing.
  Its memory figures are still right; only attribution suffers, and unattributed bytes
  count as external, which errs on the safe side.
* The whole sample fails on anything else: initialisation (DriverNotLoaded,
  LibRmVersionMismatch, NoPermission, LibraryNotFound), the device count, a device's
  handle, name, UUID or memory, and any other error of a process list (GpuIsLost,
  Unknown, ResetRequired, …). Memory the gate cannot read is memory it cannot budget,
  and a GPU that fell off the bus is a host-level emergency, not one missing row.
* The driver version is informational: if it cannot be read it is "".

A lost GPU (GpuIsLost, ResetRequired, or NVML found uninitialised) invalidates what this
process holds of NVML: the reader gives its initialisation back (nvmlShutdown once no
other reader holds it) and initialises again on a later read, fetching handles afresh.
Attempts are spaced by a backoff that doubles from REOPEN_INITIAL to REOPEN_MAX while they
fail; in between, a read fails at once with the last error, without calling the driver.
"""

from __future__ import annotations

import contextlib
import ctypes
import enum
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import attrs
import pynvml

from gpugate.core.observation import DriverFault

LIBRARY_ENV = "GPUGATE_NVML_LIBRARY"
"""Path of the libnvidia-ml.so.1 to load when the configuration names none."""

_T = TypeVar("_T")

_MEMORY_V1_FALLBACK = frozenset(
    {
        pynvml.NVML_ERROR_FUNCTION_NOT_FOUND,
        pynvml.NVML_ERROR_NOT_SUPPORTED,
        pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH,
    }
)
_PROCESS_LIST_UNAVAILABLE = frozenset(
    {
        pynvml.NVML_ERROR_NOT_SUPPORTED,
        pynvml.NVML_ERROR_NO_PERMISSION,
        pynvml.NVML_ERROR_FUNCTION_NOT_FOUND,
        pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH,
        pynvml.NVML_ERROR_INSUFFICIENT_SIZE,
    }
)
_REOPEN_AFTER = frozenset(
    {
        pynvml.NVML_ERROR_GPU_IS_LOST,
        pynvml.NVML_ERROR_RESET_REQUIRED,
        pynvml.NVML_ERROR_UNINITIALIZED,
    }
)
REOPEN_INITIAL = 0.5
REOPEN_MAX = 30.0
"""Seconds between re-initialisations of NVML after a lost GPU, doubling while they fail."""
_OPTIONAL_UNAVAILABLE = frozenset(
    {pynvml.NVML_ERROR_FUNCTION_NOT_FOUND, pynvml.NVML_ERROR_NOT_SUPPORTED}
)


class MemoryApi(enum.Enum):
    """Which memory call answered."""

    V2 = "nvmlDeviceGetMemoryInfo_v2"
    V1 = "nvmlDeviceGetMemoryInfo"


class ContextKind(enum.Flag):
    """The process lists a PID appears in."""

    COMPUTE = enum.auto()
    GRAPHICS = enum.auto()

    @property
    def letters(self) -> str:
        """The type as nvidia-smi prints it: "C", "G" or "CG"."""
        return ("C" if self & ContextKind.COMPUTE else "") + (
            "G" if self & ContextKind.GRAPHICS else ""
        )


@attrs.frozen
class ProcessSample:
    """One PID on one device, the compute and graphics lists merged."""

    pid: int
    used: int | None
    """Bytes, or None where the driver cannot tell (NVML_VALUE_NOT_AVAILABLE)."""
    kind: ContextKind


@attrs.frozen
class DeviceSample:
    """One device as NVML reports it."""

    index: int
    uuid: str
    name: str
    total: int
    reserved: int
    used: int
    free: int
    memory_api: MemoryApi
    processes: tuple[ProcessSample, ...] = ()
    process_fault: DriverFault | None = None
    """Set when a process list could not be read; `processes` is then incomplete."""


@attrs.frozen
class HostSample:
    """Every device at one moment, before attribution."""

    driver_version: str
    devices: tuple[DeviceSample, ...]


class NvmlError(Exception):
    """An NVML call failed: the code, pynvml's class name and the call say which and why."""

    def __init__(
        self, code: int, name: str, call: str, message: str, gpu: int | None = None
    ) -> None:
        where = f" on GPU {gpu}" if gpu is not None else ""
        super().__init__(f"{call}{where}: {message} ({name}, NVML code {code})")
        self.code = code
        self.name = name
        self.call = call
        self.message = message
        self.gpu = gpu

    @classmethod
    def of(cls, call: str, exc: Exception, gpu: int | None = None) -> NvmlError:
        """Convert what pynvml raised."""
        if isinstance(exc, pynvml.NVMLError):
            code = int(exc.value)
            try:
                message = str(exc)
            except Exception:  # str() may call nvmlErrorString in a broken library
                message = f"NVML error {code}"
            return cls(code, type(exc).__name__, call, message, gpu)
        # NVMLLibraryMismatchError: pynvml's unversioned wrapper found no versioned symbol.
        return cls(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND, type(exc).__name__, call, str(exc), gpu)

    def again(self) -> NvmlError:
        """The same failure, raised anew."""
        return NvmlError(self.code, self.name, self.call, self.message, self.gpu)

    def fault(self) -> DriverFault:
        """The failure as the gate records it (class DRIVER_ERROR)."""
        where = f"GPU {self.gpu}: " if self.gpu is not None else ""
        return DriverFault(self.code, self.name, where + self.message, self.call, self.gpu)


def _call(call: str, fn: Callable[..., _T], *args: Any, gpu: int | None = None) -> _T:
    try:
        return fn(*args)
    except (pynvml.NVMLError, pynvml.NVMLLibraryMismatchError) as exc:
        raise NvmlError.of(call, exc, gpu) from exc


# -- one initialisation per process ----------------------------------------------------

_init_lock = threading.Lock()
_users = 0


def _load(path: Path) -> ctypes.CDLL:
    try:
        return ctypes.CDLL(str(path))
    except OSError as exc:
        raise NvmlError(
            pynvml.NVML_ERROR_LIBRARY_NOT_FOUND,
            "NVMLError_LibraryNotFound",
            "dlopen",
            f"cannot load {path}: {exc}",
        ) from exc


def _is_current(lib: ctypes.CDLL) -> bool:
    current = pynvml.nvmlLib
    return current is not None and getattr(current, "_handle", None) == lib._handle


def _acquire(library: Path | None) -> None:
    global _users
    with _init_lock:
        if _users == 0:
            if library is not None:
                lib = _load(library)
                if not _is_current(lib):
                    pynvml.nvmlLib = lib
                    # Pointers resolved from a previous library would still be called.
                    pynvml._nvmlGetFunctionPointer_cache.clear()
            _call("nvmlInitWithFlags", pynvml.nvmlInit)
        elif library is not None and not _is_current(_load(library)):
            # pynvml holds one library per process; a second one cannot be initialised.
            raise NvmlError(
                pynvml.NVML_ERROR_ALREADY_INITIALIZED,
                "NVMLError_AlreadyInitialized",
                "dlopen",
                f"NVML is already initialised from another library than {library}",
            )
        _users += 1


def _release() -> None:
    global _users
    with _init_lock:
        if _users == 0:
            return
        _users -= 1
        if _users == 0:
            # A failing shutdown leaves nothing for us to undo; the next init starts afresh.
            with contextlib.suppress(pynvml.NVMLError):
                pynvml.nvmlShutdown()


def open_count() -> int:
    """How many readers hold NVML initialised in this process."""
    return _users


def library_from(configured: Path | None) -> Path | None:
    """The library to load: the configured one, else $GPUGATE_NVML_LIBRARY, else none."""
    if configured is not None:
        return configured
    env = os.environ.get(LIBRARY_ENV)
    return Path(env) if env else None


SIMULATED_SYMBOL = "gpugateSimulatedHost"
"""Exported by the simulated host's libnvidia-ml only (gpugate/sim/fakenvml.c): the path of
the simulated host's state file."""
SYSTEM_LIBRARY = "libnvidia-ml.so.1"


def simulated_host(library: Path | None) -> Path | None:
    """The state file of the simulated host whose NVML `library` (else the one the dynamic
    loader finds) serves, or None for a real NVML or none at all."""
    try:
        lib = ctypes.CDLL(str(library) if library is not None else SYSTEM_LIBRARY)
    except OSError:
        return None
    probe = getattr(lib, SIMULATED_SYMBOL, None)
    if probe is None:
        return None
    probe.restype = ctypes.c_char_p
    path = (probe() or b"").decode(errors="replace")
    return Path(path) if path else Path()


# -- reading ---------------------------------------------------------------------------


class NvmlReader:
    """Reads every device's memory and processes; one instance may be shared by threads."""

    def __init__(
        self, library: Path | None = None, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.library = library
        self._clock = clock
        self._lock = threading.Lock()
        self._open = False
        self._driver_version = ""
        self._lost: NvmlError | None = None
        self._backoff = 0.0
        self._retry_at = 0.0

    def __enter__(self) -> NvmlReader:
        self.open()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def is_open(self) -> bool:
        """Whether this reader holds NVML initialised."""
        return self._open

    def open(self) -> None:
        """Initialise NVML (once per process); raises NvmlError when the driver refuses."""
        with self._lock:
            self._open_locked()

    def close(self) -> None:
        """Release NVML; the last reader to close shuts it down."""
        with self._lock:
            self._close_locked()

    def _close_locked(self) -> None:
        if self._open:
            self._open = False
            _release()

    @property
    def lost(self) -> NvmlError | None:
        """The error that made the reader give NVML back, until a read succeeds again."""
        return self._lost

    def read(self) -> HostSample:
        """One sample of every device (opening NVML first if needed); raises NvmlError."""
        with self._lock:
            if self._lost is not None and self._clock() < self._retry_at:
                raise self._lost.again()
            try:
                self._open_locked()
                count = _call("nvmlDeviceGetCount_v2", pynvml.nvmlDeviceGetCount)
                devices = tuple(self._device(index) for index in range(count))
            except NvmlError as exc:
                if self._lost is not None or exc.code in _REOPEN_AFTER:
                    self._lose_locked(exc)
                raise
            self._lost = None
            self._backoff = 0.0
            return HostSample(self._driver_version, devices)

    def _lose_locked(self, exc: NvmlError) -> None:
        """Give NVML back and say when to initialise it again."""
        self._close_locked()
        if self._lost is None:
            self._backoff = REOPEN_INITIAL
        else:
            self._backoff = min(REOPEN_MAX, self._backoff * 2)
        self._lost = exc
        self._retry_at = self._clock() + self._backoff

    def _open_locked(self) -> None:
        if self._open:
            return
        _acquire(self.library)
        self._open = True
        try:
            version = _call("nvmlSystemGetDriverVersion", pynvml.nvmlSystemGetDriverVersion)
        except NvmlError as exc:
            if exc.code not in _OPTIONAL_UNAVAILABLE:
                self._open = False
                _release()
                raise
            version = ""
        self._driver_version = str(version)

    def _device(self, index: int) -> DeviceSample:
        handle = _call(
            "nvmlDeviceGetHandleByIndex_v2", pynvml.nvmlDeviceGetHandleByIndex, index, gpu=index
        )
        name = _call("nvmlDeviceGetName", pynvml.nvmlDeviceGetName, handle, gpu=index)
        uuid = _call("nvmlDeviceGetUUID", pynvml.nvmlDeviceGetUUID, handle, gpu=index)
        memory = _memory(handle, index)
        processes, fault = _processes(handle, index)
        return DeviceSample(
            index=index,
            uuid=str(uuid),
            name=str(name),
            total=memory.total,
            reserved=memory.reserved,
            used=memory.used,
            free=memory.free,
            memory_api=memory.api,
            processes=processes,
            process_fault=fault,
        )


@attrs.frozen
class _Memory:
    total: int
    reserved: int
    used: int
    free: int
    api: MemoryApi


def _memory(handle: object, index: int) -> _Memory:
    try:
        m = _call(
            MemoryApi.V2.value,
            pynvml.nvmlDeviceGetMemoryInfo,
            handle,
            pynvml.nvmlMemory_v2,
            gpu=index,
        )
        return _Memory(int(m.total), int(m.reserved), int(m.used), int(m.free), MemoryApi.V2)
    except NvmlError as exc:
        if exc.code not in _MEMORY_V1_FALLBACK:
            raise
    m = _call(MemoryApi.V1.value, pynvml.nvmlDeviceGetMemoryInfo, handle, gpu=index)
    return _Memory(int(m.total), 0, int(m.used), int(m.free), MemoryApi.V1)


@attrs.frozen
class _ProcessList:
    """One process list: the current call and the older one that stands in for it."""

    kind: ContextKind
    call: str
    fn: Callable[[object], list[Any]]
    older_call: str
    older_fn: Callable[[object], list[Any]]

    def read(self, handle: object, index: int) -> list[Any]:
        try:
            return _call(self.call, self.fn, handle, gpu=index)
        except NvmlError as exc:
            if exc.code != pynvml.NVML_ERROR_FUNCTION_NOT_FOUND:
                raise
        return _call(self.older_call, self.older_fn, handle, gpu=index)


# The unversioned wrappers call _v3 and raise NVMLLibraryMismatchError when it is missing.
_LISTS = (
    _ProcessList(
        ContextKind.COMPUTE,
        "nvmlDeviceGetComputeRunningProcesses_v3",
        pynvml.nvmlDeviceGetComputeRunningProcesses,
        "nvmlDeviceGetComputeRunningProcesses_v2",
        pynvml.nvmlDeviceGetComputeRunningProcesses_v2,
    ),
    _ProcessList(
        ContextKind.GRAPHICS,
        "nvmlDeviceGetGraphicsRunningProcesses_v3",
        pynvml.nvmlDeviceGetGraphicsRunningProcesses,
        "nvmlDeviceGetGraphicsRunningProcesses_v2",
        pynvml.nvmlDeviceGetGraphicsRunningProcesses_v2,
    ),
)


def _processes(handle: object, index: int) -> tuple[tuple[ProcessSample, ...], DriverFault | None]:
    merged: dict[int, ProcessSample] = {}
    fault: DriverFault | None = None
    for process_list in _LISTS:
        try:
            rows = process_list.read(handle, index)
        except NvmlError as exc:
            if exc.code not in _PROCESS_LIST_UNAVAILABLE:
                raise
            fault = fault or exc.fault()
            continue
        for row in rows:
            pid = int(row.pid)
            used = None if row.usedGpuMemory is None else int(row.usedGpuMemory)
            kind = process_list.kind
            seen = merged.get(pid)
            if seen is not None:
                # A C+G process has one context: its bytes appear in both lists, once.
                used = _larger(seen.used, used)
                kind = seen.kind | kind
            merged[pid] = ProcessSample(pid, used, kind)
    return tuple(merged.values()), fault


def _larger(a: int | None, b: int | None) -> int | None:
    known = [x for x in (a, b) if x is not None]
    return max(known) if known else None
