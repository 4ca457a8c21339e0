"""NVML's failures as the gate sees them: one exception type, whatever pynvml raised."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import pynvml

from gpugate.core.observation import DriverFault

_T = TypeVar("_T")


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


def nvml_call(call: str, fn: Callable[..., _T], *args: Any, gpu: int | None = None) -> _T:
    """`fn(*args)`, what it raises of pynvml's as an NvmlError naming `call` and `gpu`."""
    try:
        return fn(*args)
    except (pynvml.NVMLError, pynvml.NVMLLibraryMismatchError) as exc:
        raise NvmlError.of(call, exc, gpu) from exc
