"""What a sample asks of NVML, through the real pynvml over the fake library: identities
once per initialisation, one call per process list while its buffer holds it, and the
same records while nothing changed."""

from __future__ import annotations

import ctypes
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pynvml
import pytest

from gpugate.core.units import GiB, MiB
from gpugate.gpu import nvml
from gpugate.gpu.nvml import ContextKind, NvmlReader, ProcessSample
from gpugate_sim.device import SimDevice, SimProcess, SimulatedGpuHost
from gpugate_sim.shim import STATE_ENV


@pytest.fixture
def host(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fakenvml_loaded: ctypes.CDLL
) -> SimulatedGpuHost:
    """Two cards; PIDs need not exist."""
    host = SimulatedGpuHost.create(
        tmp_path / "gpu",
        [
            SimDevice(0, 16 * GiB, 434 * MiB, "GPU-aaaa", "NVIDIA GeForce RTX 4080"),
            SimDevice(1, 24 * GiB, 300 * MiB, "GPU-bbbb", "NVIDIA GeForce RTX 3090"),
        ],
        check_pids=False,
    )
    monkeypatch.setenv(STATE_ENV, str(host.state_path))
    return host


@pytest.fixture
def reader(host: SimulatedGpuHost) -> Iterator[NvmlReader]:
    reader = NvmlReader()
    yield reader
    reader.close()
    assert nvml.open_count() == 0


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """The C functions pynvml calls, by name (its lookup precedes every call)."""
    counted: Counter[str] = Counter()
    lookup = pynvml._nvmlGetFunctionPointer

    def counting(name: str) -> Callable[..., Any]:
        fn = lookup(name)
        if name == "nvmlErrorString":  # pynvml sets its restype on the pointer
            return fn

        def call(*args: Any) -> Any:
            counted[name] += 1
            return fn(*args)

        return call

    monkeypatch.setattr(pynvml, "_nvmlGetFunctionPointer", counting)
    return counted


STEADY = Counter(
    {
        "nvmlDeviceGetCount_v2": 1,
        "nvmlDeviceGetMemoryInfo_v2": 4,  # before and after each card's lists
        "nvmlDeviceGetComputeRunningProcesses_v3": 2,
        "nvmlDeviceGetGraphicsRunningProcesses_v3": 2,
    }
)


def test_a_steady_sample_is_the_count_memory_and_one_call_per_list(
    host: SimulatedGpuHost, reader: NvmlReader, calls: Counter[str]
) -> None:
    for pid in (100, 101, 102):
        host.allocate(pid, GiB, gpu=0)
    host.add_process(SimProcess(1, 200, 50 * MiB, "G", "Xorg"))
    first = reader.read()
    assert calls["nvmlDeviceGetName"] == calls["nvmlDeviceGetUUID"] == 2
    calls.clear()

    again = reader.read()

    assert calls == STEADY
    assert again == first
    assert [d.name for d in again.devices] == ["NVIDIA GeForce RTX 4080", "NVIDIA GeForce RTX 3090"]
    assert [p.pid for p in again.devices[0].processes] == [100, 101, 102]


def test_a_list_that_outgrew_its_buffer_is_read_again_in_full(
    host: SimulatedGpuHost, reader: NvmlReader, calls: Counter[str]
) -> None:
    host.allocate(100, MiB, gpu=0)
    reader.read()  # the buffer now holds 1 × 2 + 5 rows
    for pid in range(1000, 1020):
        host.allocate(pid, MiB, gpu=0)
    calls.clear()

    grown = reader.read().devices[0]

    assert [p.pid for p in grown.processes] == [100, *range(1000, 1020)]
    assert calls["nvmlDeviceGetComputeRunningProcesses_v3"] == 2 + 1  # too small, again; GPU 1
    calls.clear()
    reader.read()
    assert calls == STEADY


def test_unchanged_rows_give_the_same_records(host: SimulatedGpuHost, reader: NvmlReader) -> None:
    host.allocate(100, GiB, gpu=0)
    host.add_process(SimProcess(0, 300, 300 * MiB, "CG", "blender"))
    first = reader.read().devices[0].processes

    again = reader.read().devices[0].processes
    host.allocate(101, GiB, gpu=0)
    changed = reader.read().devices[0].processes

    assert again is first
    assert changed is not first
    assert changed == (
        ProcessSample(100, GiB, ContextKind.COMPUTE),
        ProcessSample(300, 300 * MiB, ContextKind.COMPUTE | ContextKind.GRAPHICS),
        ProcessSample(101, GiB, ContextKind.COMPUTE),
    )


def test_a_new_initialisation_asks_for_names_again(
    host: SimulatedGpuHost, reader: NvmlReader, calls: Counter[str]
) -> None:
    reader.read()
    reader.close()
    calls.clear()

    reader.read()

    assert calls["nvmlDeviceGetHandleByIndex_v2"] == calls["nvmlDeviceGetName"] == 2


def test_an_empty_list_costs_one_call(
    host: SimulatedGpuHost, reader: NvmlReader, calls: Counter[str]
) -> None:
    reader.read()
    calls.clear()

    devices = reader.read().devices

    assert [d.processes for d in devices] == [(), ()]
    assert calls == STEADY
