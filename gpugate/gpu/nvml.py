"""NVML through pynvml: with `errors.py` and `proclists.py`, the only code that imports it.

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
  that outgrew even a buffer sized from the count NVML had just given) → the device is
  reported with the processes of the other list, if any, and `process_fault` says what
  is missing. Its memory figures are still right; only attribution suffers, and
  unattributed bytes count as external, which errs on the safe side.
* The whole sample fails on anything else: initialisation (DriverNotLoaded,
  LibRmVersionMismatch, NoPermission, LibraryNotFound), the device count, a device's
  handle, name, UUID or memory, and any other error of a process list (GpuIsLost,
  Unknown, ResetRequired, …). Memory the gate cannot read is memory it cannot budget,
  and a GPU that fell off the bus is a host-level emergency, not one missing row.
* The driver version is informational: if it cannot be read it is "".

A device's handle, name and UUID are read once per initialisation (handles stay valid
until nvmlShutdown, and neither a name nor a UUID changes under them): a sample is the
device count and, per device, its memory read before and after its two process lists
(the lower reading kept), one call each while their buffers are large enough
(`proclists.py`); when memory moved while the lists were read, they are read again
between that reading and the next, up to LIST_READS times.

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

import attrs
import pynvml

from gpugate.core.observation import DriverFault
from gpugate.gpu.errors import NvmlError
from gpugate.gpu.errors import nvml_call as _call
from gpugate.gpu.proclists import ContextKind, ProcessLists, ProcessSample

__all__ = [
    "ContextKind",
    "DeviceSample",
    "HostSample",
    "MemoryApi",
    "NvmlError",
    "NvmlReader",
    "ProcessSample",
    "library_from",
    "open_count",
    "simulated_host",
]

LIBRARY_ENV = "GPUGATE_NVML_LIBRARY"
"""Path of the libnvidia-ml.so.1 to load when the configuration names none."""

_MEMORY_V1_FALLBACK = frozenset(
    {
        pynvml.NVML_ERROR_FUNCTION_NOT_FOUND,
        pynvml.NVML_ERROR_NOT_SUPPORTED,
        pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH,
    }
)
_REOPEN_AFTER = frozenset(
    {
        pynvml.NVML_ERROR_GPU_IS_LOST,
        pynvml.NVML_ERROR_RESET_REQUIRED,
        pynvml.NVML_ERROR_UNINITIALIZED,
    }
)
LIST_READS = 3
"""Reads of a device's process lists in one sample while its used memory moves under them."""
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
"""Exported by the simulated host's libnvidia-ml only (gpugate_sim/fakenvml.c): the path of
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
        self._devices: list[_Device] = []
        """By device index, for the current initialisation."""
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
            # Handles die with the initialisation; the next one fetches them afresh.
            self._devices = []
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
                # Devices past the count are gone; a later one at their index may be
                # another card.
                del self._devices[count:]
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
        device = self._known(index)
        before = _memory(device.handle, index)
        for attempt in range(LIST_READS):
            processes, fault = device.lists.read(device.handle, index)
            after = _memory(device.handle, index)
            if after.used == before.used or attempt == LIST_READS - 1:
                break
            # Memory moved while the lists were read: they may still name a process whose
            # memory is gone (a runner that exited just after them), whose bytes would
            # then count twice, its consumer's and, once its model is off the books, its
            # consumer's unexplained. Lists read between two equal readings name none.
            before = after
        # Used memory and the process lists are separate reads: memory a process gives back
        # between them (ComfyUI freeing its cached models one by one) would be, for one
        # sample, used memory no process accounts for, and taken for another program's.
        # Of two readings around the lists, the lower holds none of it.
        memory = after if after.used < before.used else before
        return DeviceSample(
            index=index,
            uuid=device.uuid,
            name=device.name,
            total=memory.total,
            reserved=memory.reserved,
            used=memory.used,
            free=memory.free,
            memory_api=memory.api,
            processes=processes,
            process_fault=fault,
        )

    def _known(self, index: int) -> _Device:
        if index < len(self._devices):
            return self._devices[index]
        handle = _call(
            "nvmlDeviceGetHandleByIndex_v2", pynvml.nvmlDeviceGetHandleByIndex, index, gpu=index
        )
        name = _call("nvmlDeviceGetName", pynvml.nvmlDeviceGetName, handle, gpu=index)
        uuid = _call("nvmlDeviceGetUUID", pynvml.nvmlDeviceGetUUID, handle, gpu=index)
        device = _Device(handle, str(name), str(uuid))
        # Devices are read in index order, so a new one is always the next index.
        if index == len(self._devices):
            self._devices.append(device)
        return device


@attrs.frozen
class _Device:
    """A device for as long as NVML stays initialised: what does not change under its
    handle, and its process lists' buffers and last rows."""

    handle: object
    name: str
    uuid: str
    lists: ProcessLists = attrs.field(factory=ProcessLists)


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
