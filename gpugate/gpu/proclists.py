"""A device's compute and graphics process lists, read straight from NVML's rows.

pynvml's list wrappers ask twice per list (once for the count, once for the rows) and
turn every row into a "friendly object" field by field; the gate needs two fields of a
few hundred rows, every sample. So it calls the list functions itself, through pynvml's
function lookup: with a buffer kept from the last read, one call fills it (NVML answers
INSUFFICIENT_SIZE with the count needed when it is too small, and only then is a larger
one made and the call repeated), and the rows are unpacked from the bytes NVML wrote.
An idle host lists the same rows sample after sample; the bytes then compare equal and
the last records are handed back as they are, without a row decoded.

The `_v3` list falls back to `_v2` where the library has no `_v3` (drivers before 510).
"""

from __future__ import annotations

import ctypes
import enum
import struct

import attrs
import pynvml

from gpugate.core.observation import DriverFault
from gpugate.gpu.errors import NvmlError, nvml_call

UNAVAILABLE = frozenset(
    {
        pynvml.NVML_ERROR_NOT_SUPPORTED,
        pynvml.NVML_ERROR_NO_PERMISSION,
        pynvml.NVML_ERROR_FUNCTION_NOT_FOUND,
        pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH,
        pynvml.NVML_ERROR_INSUFFICIENT_SIZE,
    }
)
"""Errors that leave a device without one list (a fault), not the sample without data."""


class ContextKind(enum.Flag):
    """The process lists a PID appears in."""

    COMPUTE = enum.auto()
    GRAPHICS = enum.auto()

    @property
    def letters(self) -> str:
        """The type as nvidia-smi prints it: "C", "G" or "CG"."""
        # A table by value: Flag arithmetic per process and sample is not free.
        return _LETTERS[self._value_]


_LETTERS = ("", "C", "G", "CG")
"""ContextKind's letters by its value (COMPUTE 1, GRAPHICS 2)."""


@attrs.frozen
class ProcessSample:
    """One PID on one device, the compute and graphics lists merged."""

    pid: int
    used: int | None
    """Bytes, or None where the driver cannot tell (NVML_VALUE_NOT_AVAILABLE)."""
    kind: ContextKind


_ROW = pynvml.c_nvmlProcessInfo_v2_t
"""A row of the _v2 and _v3 lists (pynvml gives both the same layout)."""


def _row_layout(row: type[ctypes.Structure]) -> struct.Struct:
    """`pid` and `usedGpuMemory` of one row, the rest skipped, in native byte order."""
    pid, used = row.pid, row.usedGpuMemory  # type: ignore[attr-defined]
    size = ctypes.sizeof(row)
    if not (pid.size == 4 and used.size == 8 and pid.offset + 4 <= used.offset):
        raise ImportError(f"unexpected layout of pynvml's {row.__name__}")
    gap, tail = used.offset - pid.offset - 4, size - used.offset - 8
    return struct.Struct(f"={pid.offset}xI{gap}xQ{tail}x")


_ROW_LAYOUT = _row_layout(_ROW)
_ROW_SIZE = ctypes.sizeof(_ROW)
_NOT_AVAILABLE = pynvml.NVML_VALUE_NOT_AVAILABLE_ulonglong.value


@attrs.frozen
class _ListKind:
    """One process list: the current call and the older one that stands in for it."""

    kind: ContextKind
    call: str
    older_call: str


_KINDS = (
    _ListKind(
        ContextKind.COMPUTE,
        "nvmlDeviceGetComputeRunningProcesses_v3",
        "nvmlDeviceGetComputeRunningProcesses_v2",
    ),
    _ListKind(
        ContextKind.GRAPHICS,
        "nvmlDeviceGetGraphicsRunningProcesses_v3",
        "nvmlDeviceGetGraphicsRunningProcesses_v2",
    ),
)


@attrs.define
class _List:
    """One list of one device: the buffer NVML fills, kept from read to read."""

    kind: _ListKind
    array: ctypes.Array[ctypes.Structure] | None = None

    def read(self, handle: object, index: int) -> bytes:
        """The rows NVML wrote; raises NvmlError."""
        try:
            return nvml_call(self.kind.call, self._fill, self.kind.call, handle, gpu=index)
        except NvmlError as exc:
            if exc.code != pynvml.NVML_ERROR_FUNCTION_NOT_FOUND:
                raise
        older = self.kind.older_call
        return nvml_call(older, self._fill, older, handle, gpu=index)

    def _fill(self, call: str, handle: object) -> bytes:
        # Looked up on every call, as pynvml's own wrappers do (it caches the pointer);
        # a library without the function raises NVMLError_FunctionNotFound here.
        fn = pynvml._nvmlGetFunctionPointer(call)
        array = self.array
        count = ctypes.c_uint(0 if array is None else len(array))
        ret = fn(handle, ctypes.byref(count), array)
        if ret == pynvml.NVML_ERROR_INSUFFICIENT_SIZE:
            # Room for the count NVML asked for and for processes that start before the
            # next call, as pynvml leaves.
            array = self.array = (_ROW * (count.value * 2 + 5))()
            count.value = len(array)
            ret = fn(handle, ctypes.byref(count), array)
        if ret != pynvml.NVML_SUCCESS:
            raise pynvml.NVMLError(ret)
        if not count.value or array is None:
            return b""
        return ctypes.string_at(array, count.value * _ROW_SIZE)


@attrs.define
class ProcessLists:
    """Both process lists of one device, for as long as its handle is valid."""

    lists: tuple[_List, ...] = attrs.field(factory=lambda: tuple(_List(k) for k in _KINDS))
    rows: tuple[bytes, ...] | None = None
    """Both lists' rows as last read, when both could be."""
    merged: tuple[ProcessSample, ...] = ()
    """What those rows made."""

    def read(
        self, handle: object, index: int
    ) -> tuple[tuple[ProcessSample, ...], DriverFault | None]:
        """Both lists merged by PID, and what could not be read of them; raises NvmlError
        on errors other than UNAVAILABLE."""
        rows: list[bytes] = []
        fault: DriverFault | None = None
        for process_list in self.lists:
            try:
                rows.append(process_list.read(handle, index))
            except NvmlError as exc:
                if exc.code not in UNAVAILABLE:
                    raise
                fault = fault or exc.fault()
                rows.append(b"")
        if fault is not None:
            self.rows = None
            return _merge(rows), fault
        key = tuple(rows)
        if key != self.rows:
            self.rows, self.merged = key, _merge(rows)
        return self.merged, None


def _merge(rows: list[bytes]) -> tuple[ProcessSample, ...]:
    merged: dict[int, ProcessSample] = {}
    for list_kind, data in zip(_KINDS, rows, strict=True):
        kind = list_kind.kind
        for pid, used in _ROW_LAYOUT.iter_unpack(data):
            if used == _NOT_AVAILABLE:
                used = None
            seen = merged.get(pid)
            if seen is None:
                merged[pid] = ProcessSample(pid, used, kind)
            else:
                # A C+G process has one context: its bytes appear in both lists, once.
                merged[pid] = ProcessSample(pid, _larger(seen.used, used), seen.kind | kind)
    return tuple(merged.values())


def _larger(a: int | None, b: int | None) -> int | None:
    known = [x for x in (a, b) if x is not None]
    return max(known) if known else None
