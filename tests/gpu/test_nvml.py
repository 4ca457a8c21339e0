"""The NVML reader through the real pynvml, over the simulated host's fake libnvidia-ml."""

from __future__ import annotations

import ctypes
import ctypes.util
from collections.abc import Iterator
from pathlib import Path

import pynvml
import pytest

from gpugate.core.observation import DriverFault
from gpugate.core.units import GiB, MiB
from gpugate.gpu import nvml
from gpugate.gpu.nvml import (
    LIBRARY_ENV,
    ContextKind,
    MemoryApi,
    NvmlError,
    NvmlReader,
    ProcessSample,
    library_from,
)
from gpugate.gpu.proclists import ProcessLists
from gpugate_sim.device import SimDevice, SimProcess, SimulatedGpuHost
from gpugate_sim.shim import STATE_ENV

UUID0 = "GPU-5f0e3a41-9b1c-4d2e-8f37-6a2b1c0d9e84"
UUID1 = "GPU-0b7d55e2-1c3a-4f60-9e21-7d8c4b3a2f10"


@pytest.fixture
def host(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fakenvml_loaded: ctypes.CDLL
) -> SimulatedGpuHost:
    """Two cards; PIDs need not exist, so tests can list any PID they like."""
    host = SimulatedGpuHost.create(
        tmp_path / "gpu",
        [
            SimDevice(0, 16 * GiB, 434 * MiB, UUID0, "NVIDIA GeForce RTX 4080", 352 * MiB),
            SimDevice(1, 24 * GiB, 300 * MiB, UUID1, "NVIDIA GeForce RTX 3090"),
        ],
        driver="555.42.06",
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


def test_two_devices_with_v2_memory(host: SimulatedGpuHost, reader: NvmlReader) -> None:
    host.allocate(4242, 7796 * MiB, gpu=0)
    host.allocate(5151, 2 * GiB, gpu=1)
    state = host.read()

    sample = reader.read()

    assert sample.driver_version == "555.42.06"
    assert [(d.index, d.uuid, d.name) for d in sample.devices] == [
        (0, UUID0, "NVIDIA GeForce RTX 4080"),
        (1, UUID1, "NVIDIA GeForce RTX 3090"),
    ]
    for device, sim in zip(sample.devices, state.devices, strict=True):
        assert device.memory_api is MemoryApi.V2
        assert (device.total, device.reserved) == (sim.total, sim.reserved)
        assert device.used == state.used(sim.index)
        assert device.free == state.free(sim.index)
        assert device.total == device.reserved + device.used + device.free
        assert device.process_fault is None
    assert sample.devices[0].processes == (ProcessSample(4242, 7796 * MiB, ContextKind.COMPUTE),)
    assert sample.devices[1].processes == (ProcessSample(5151, 2 * GiB, ContextKind.COMPUTE),)


def test_changes_show_in_the_next_read(host: SimulatedGpuHost, reader: NvmlReader) -> None:
    host.allocate(4242, GiB, gpu=0)
    before = reader.read().devices[0]

    host.release(4242)
    after = reader.read().devices[0]

    assert after.free - before.free == GiB
    assert (before.processes[0].pid, after.processes) == (4242, ())


@pytest.mark.parametrize("code", [13, 3])
def test_v1_memory_when_v2_is_missing(
    host: SimulatedGpuHost, reader: NvmlReader, code: int
) -> None:
    host.allocate(4242, 3 * GiB, gpu=1)
    host.inject("nvmlDeviceGetMemoryInfo_v2", code, gpu=1)
    state = host.read()

    gpu0, gpu1 = reader.read().devices

    assert gpu0.memory_api is MemoryApi.V2
    assert gpu1.memory_api is MemoryApi.V1
    # v1 has no `reserved`: its `used` includes the reservation.
    assert gpu1.reserved == 0
    assert gpu1.used == state.used(1) + state.device(1).reserved
    assert gpu1.free == state.free(1)
    assert gpu1.total == state.device(1).total


def test_compute_and_graphics_lists_merge_by_pid(
    host: SimulatedGpuHost, reader: NvmlReader
) -> None:
    for process in [
        SimProcess(0, 100, GiB, "C", "ollama"),
        SimProcess(0, 200, 50 * MiB, "G", "Xorg"),
        SimProcess(0, 300, 300 * MiB, "CG", "blender"),
        # One context, listed twice with different figures: counted once, the larger.
        SimProcess(0, 400, 200 * MiB, "C", "kwin"),
        SimProcess(0, 400, 120 * MiB, "G", "kwin"),
    ]:
        host.add_process(process)

    processes = {p.pid: p for p in reader.read().devices[0].processes}

    assert processes == {
        100: ProcessSample(100, GiB, ContextKind.COMPUTE),
        200: ProcessSample(200, 50 * MiB, ContextKind.GRAPHICS),
        300: ProcessSample(300, 300 * MiB, ContextKind.COMPUTE | ContextKind.GRAPHICS),
        400: ProcessSample(400, 200 * MiB, ContextKind.COMPUTE | ContextKind.GRAPHICS),
    }
    assert [processes[pid].kind.letters for pid in (100, 200, 300)] == ["C", "G", "CG"]


def test_unknown_process_memory_stays_none(host: SimulatedGpuHost, reader: NvmlReader) -> None:
    host.add_process(SimProcess(0, 600, -1, "G", "dwm"))
    host.add_process(SimProcess(0, 601, -1, "CG", "game"))
    host.add_process(SimProcess(0, 601, 80 * MiB, "C", "game"))

    processes = {p.pid: p.used for p in reader.read().devices[0].processes}

    assert processes == {600: None, 601: 80 * MiB}


@pytest.mark.parametrize(
    ("code", "name"), [(9, "NVMLError_DriverNotLoaded"), (18, "NVMLError_LibRmVersionMismatch")]
)
def test_init_error_is_an_nvml_error_and_leaves_nothing_open(
    host: SimulatedGpuHost, reader: NvmlReader, code: int, name: str
) -> None:
    initialised_before = pynvml._nvmlLib_refcount
    host.set_init_error(code)

    with pytest.raises(NvmlError) as caught:
        reader.read()

    error = caught.value
    assert (error.code, error.name, error.call, error.gpu) == (
        code,
        name,
        "nvmlInitWithFlags",
        None,
    )
    assert str(pynvml.NVMLError(code)) in str(error)
    assert error.fault() == DriverFault(code, name, error.message, "nvmlInitWithFlags", None)
    assert (nvml.open_count(), reader.is_open) == (0, False)
    assert pynvml._nvmlLib_refcount == initialised_before

    host.clear_injections()
    assert len(reader.read().devices) == 2


def test_gpu_lost_on_memory_fails_the_sample(host: SimulatedGpuHost, reader: NvmlReader) -> None:
    host.inject("nvmlDeviceGetMemoryInfo_v2", 15, gpu=1)

    with pytest.raises(NvmlError) as caught:
        reader.read()

    fault = caught.value.fault()
    assert (fault.code, fault.name, fault.call, fault.gpu) == (
        15,
        "NVMLError_GpuIsLost",
        "nvmlDeviceGetMemoryInfo_v2",
        1,
    )
    assert fault.message == "GPU 1: GPU is lost"
    assert "GPU 1" in str(caught.value)


def test_unsupported_process_list_degrades_only_that_device(
    host: SimulatedGpuHost, reader: NvmlReader
) -> None:
    host.add_process(SimProcess(0, 100, GiB, "C", "ollama"))
    host.add_process(SimProcess(0, 200, 50 * MiB, "G", "Xorg"))
    host.add_process(SimProcess(1, 300, GiB, "C", "comfy"))
    host.inject("nvmlDeviceGetComputeRunningProcesses_v3", 3, gpu=0)

    gpu0, gpu1 = reader.read().devices

    assert gpu0.processes == (ProcessSample(200, 50 * MiB, ContextKind.GRAPHICS),)
    assert gpu0.process_fault is not None
    assert (gpu0.process_fault.code, gpu0.process_fault.name, gpu0.process_fault.call) == (
        3,
        "NVMLError_NotSupported",
        "nvmlDeviceGetComputeRunningProcesses_v3",
    )
    assert gpu0.used == host.read().used(0)  # memory is unaffected
    assert [p.pid for p in gpu1.processes] == [300]
    assert gpu1.process_fault is None


def test_missing_v3_process_list_falls_back_to_v2(
    host: SimulatedGpuHost, reader: NvmlReader
) -> None:
    host.add_process(SimProcess(0, 100, GiB, "C", "ollama"))
    # pynvml turns FunctionNotFound of the unversioned wrapper into NVMLLibraryMismatchError.
    host.inject("nvmlDeviceGetComputeRunningProcesses_v3", 13)

    gpu0 = reader.read().devices[0]

    assert gpu0.processes == (ProcessSample(100, GiB, ContextKind.COMPUTE),)
    assert gpu0.process_fault is None


def test_library_mismatch_without_any_process_list_is_a_device_fault(
    host: SimulatedGpuHost, reader: NvmlReader
) -> None:
    host.add_process(SimProcess(0, 100, GiB, "C", "ollama"))
    host.add_process(SimProcess(0, 200, 50 * MiB, "G", "Xorg"))
    host.inject("nvmlDeviceGetGraphicsRunningProcesses_v3", 13)
    host.inject("nvmlDeviceGetGraphicsRunningProcesses_v2", 13)

    gpu0 = reader.read().devices[0]

    assert [p.pid for p in gpu0.processes] == [100]
    assert gpu0.process_fault is not None
    assert (gpu0.process_fault.code, gpu0.process_fault.call) == (
        13,
        "nvmlDeviceGetGraphicsRunningProcesses_v2",
    )


def test_library_mismatch_error_is_converted() -> None:
    mismatch = pynvml.NVMLLibraryMismatchError("Unversioned function called")

    error = NvmlError.of("nvmlDeviceGetComputeRunningProcesses_v3", mismatch, gpu=0)

    assert not isinstance(mismatch, pynvml.NVMLError)
    assert (error.code, error.name) == (13, "NVMLLibraryMismatchError")
    assert error.fault().message == "GPU 0: Unversioned function called"


def test_gpu_lost_on_a_process_list_fails_the_sample(
    host: SimulatedGpuHost, reader: NvmlReader
) -> None:
    host.inject("nvmlDeviceGetGraphicsRunningProcesses_v3", 15, gpu=1)

    with pytest.raises(NvmlError) as caught:
        reader.read()

    assert (caught.value.code, caught.value.call, caught.value.gpu) == (
        15,
        "nvmlDeviceGetGraphicsRunningProcesses_v3",
        1,
    )


def test_unreadable_driver_version_is_empty(host: SimulatedGpuHost, reader: NvmlReader) -> None:
    host.inject("nvmlSystemGetDriverVersion", 3)

    sample = reader.read()

    assert (sample.driver_version, len(sample.devices)) == ("", 2)


def test_failing_driver_version_fails_open_without_leaking(
    host: SimulatedGpuHost, reader: NvmlReader
) -> None:
    host.inject("nvmlSystemGetDriverVersion", 999)

    with pytest.raises(NvmlError) as caught:
        reader.open()

    assert (caught.value.code, caught.value.name) == (999, "NVMLError_Unknown")
    assert nvml.open_count() == 0


def test_one_initialisation_however_many_readers(host: SimulatedGpuHost) -> None:
    initialised_before = pynvml._nvmlLib_refcount
    first, second = NvmlReader(), NvmlReader()

    first.open()
    second.open()
    first.open()  # opening twice is one use

    assert (nvml.open_count(), pynvml._nvmlLib_refcount) == (2, initialised_before + 1)
    first.close()
    assert len(second.read().devices) == 2
    second.close()
    second.close()
    assert (nvml.open_count(), pynvml._nvmlLib_refcount) == (0, initialised_before)

    with NvmlReader() as again:
        assert len(again.read().devices) == 2
    assert nvml.open_count() == 0


def test_explicit_library_path(host: SimulatedGpuHost, fakenvml_path: Path) -> None:
    with NvmlReader(fakenvml_path) as reader, NvmlReader(fakenvml_path) as other:
        assert reader.read().devices[0].uuid == UUID0
        assert other.read().devices[1].uuid == UUID1
    assert nvml.open_count() == 0


def test_missing_library_is_library_not_found(host: SimulatedGpuHost, tmp_path: Path) -> None:
    missing = tmp_path / "nowhere" / "libnvidia-ml.so.1"
    library_before = pynvml.nvmlLib

    with pytest.raises(NvmlError) as caught:
        NvmlReader(missing).read()

    assert (caught.value.code, caught.value.name, caught.value.call) == (
        12,
        "NVMLError_LibraryNotFound",
        "dlopen",
    )
    assert str(missing) in caught.value.message
    assert pynvml.nvmlLib is library_before
    assert nvml.open_count() == 0


def test_another_library_cannot_join_an_open_one(reader: NvmlReader) -> None:
    reader.open()
    other = Path(ctypes.util.find_library("m") or "libm.so.6")

    with pytest.raises(NvmlError) as caught:
        NvmlReader(other).open()

    assert caught.value.name == "NVMLError_AlreadyInitialized"
    assert nvml.open_count() == 1
    assert len(reader.read().devices) == 2


def test_library_from_config_then_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(LIBRARY_ENV, raising=False)
    assert library_from(None) is None
    monkeypatch.setenv(LIBRARY_ENV, "/opt/nvidia/libnvidia-ml.so.1")
    assert library_from(None) == Path("/opt/nvidia/libnvidia-ml.so.1")
    assert library_from(Path("/etc/x.so")) == Path("/etc/x.so")


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_lost_gpu_is_read_again_after_nvml_is_initialised_again(
    host: SimulatedGpuHost,
) -> None:
    clock = FakeClock()
    reader = NvmlReader(clock=clock)
    try:
        assert len(reader.read().devices) == 2
        host.lose(1)
        with pytest.raises(NvmlError) as caught:
            reader.read()
        assert (caught.value.code, caught.value.gpu) == (pynvml.NVML_ERROR_GPU_IS_LOST, 1)
        # NVML is given back at once, so the next initialisation starts afresh.
        assert (nvml.open_count(), reader.is_open) == (0, False)

        host.clear_injections()
        with pytest.raises(NvmlError) as early:
            reader.read()  # within the backoff: the last error, without calling NVML
        assert early.value.code == pynvml.NVML_ERROR_GPU_IS_LOST and not reader.is_open

        clock.now += nvml.REOPEN_INITIAL
        gpu1 = reader.read().devices[1]
        assert (gpu1.index, gpu1.total) == (1, 24 * GiB)
        assert reader.lost is None and nvml.open_count() == 1
    finally:
        reader.close()


def test_reinitialisation_backs_off_while_the_gpu_stays_lost(host: SimulatedGpuHost) -> None:
    clock = FakeClock()
    reader = NvmlReader(clock=clock)
    host.lose(0)
    try:
        with pytest.raises(NvmlError):
            reader.read()
        gaps = []
        for _ in range(9):
            # A new attempt leaves a new error behind; one within the backoff does not.
            before, started = reader.lost, clock.now
            while reader.lost is before:
                clock.now += 0.25
                with pytest.raises(NvmlError):
                    reader.read()
            gaps.append(clock.now - started)
        assert gaps == [0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0, 30.0]
        assert (nvml.open_count(), reader.is_open) == (0, False)
    finally:
        reader.close()


def test_memory_given_back_during_a_sample_is_not_left_unaccounted(
    host: SimulatedGpuHost, reader: NvmlReader, monkeypatch: pytest.MonkeyPatch
) -> None:
    # ComfyUI's `POST /free` lets its cached models go one after the other; one going
    # between the read of used memory and the read of the process lists would be used
    # memory no process accounts for (the gate takes that for another program's, and
    # grows its reserve).
    host.allocate(4242, 6 * GiB + 335 * MiB, gpu=0)
    host.allocate(5151, GiB, gpu=0)
    quiet = reader.read().devices[0]
    overhead = quiet.used - sum(p.used or 0 for p in quiet.processes)
    lists_read = ProcessLists.read

    def freeing_midway(self: ProcessLists, handle: object, index: int):  # type: ignore[no-untyped-def]
        host.release(4242)
        host.allocate(4242, 335 * MiB, gpu=0)  # the UNet went, the VAE is still there
        return lists_read(self, handle, index)

    monkeypatch.setattr(ProcessLists, "read", freeing_midway)
    device = reader.read().devices[0]

    assert device.used - sum(p.used or 0 for p in device.processes) == overhead
    assert device.total == device.reserved + device.used + device.free
    assert {p.pid: p.used for p in device.processes} == {4242: 335 * MiB, 5151: GiB}


def test_a_process_that_exits_just_after_the_lists_are_read_is_not_listed(
    host: SimulatedGpuHost, reader: NvmlReader, monkeypatch: pytest.MonkeyPatch
) -> None:
    # An Ollama runner stopped for an eviction exits between the process lists and the
    # second reading of used memory: the lower reading no longer holds its bytes, and lists
    # that still named it would show them under Ollama after the gate took the unload as
    # done (and its model off the books): unexplained memory, and a model evicted for it.
    host.allocate(4242, 7796 * MiB, gpu=0)
    host.allocate(9001, 2012 * MiB, gpu=0)
    quiet = reader.read().devices[0]
    overhead = quiet.used - sum(p.used or 0 for p in quiet.processes)
    lists_read = ProcessLists.read
    calls = []

    def exiting_after(self: ProcessLists, handle: object, index: int):  # type: ignore[no-untyped-def]
        listed = lists_read(self, handle, index)
        if index == 0:
            calls.append([p.pid for p in listed[0]])
            if len(calls) == 1:
                host.release(9001)
        return listed

    monkeypatch.setattr(ProcessLists, "read", exiting_after)
    device = reader.read().devices[0]

    assert calls == [[4242, 9001], [4242]]
    assert {p.pid: p.used for p in device.processes} == {4242: 7796 * MiB}
    assert device.used - sum(p.used or 0 for p in device.processes) == overhead
    assert device.total == device.reserved + device.used + device.free


def test_lists_are_read_at_most_list_reads_times_while_memory_keeps_moving(
    host: SimulatedGpuHost, reader: NvmlReader, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A load streaming weights in moves used memory at every call: the sample ends anyway,
    # with the lower reading of its last pair.
    host.allocate(4242, GiB, gpu=0)
    lists_read = ProcessLists.read
    calls = []

    def growing(self: ProcessLists, handle: object, index: int):  # type: ignore[no-untyped-def]
        listed = lists_read(self, handle, index)
        if index == 0:
            calls.append(1)
            host.allocate(4242, 100 * MiB, gpu=0)
        return listed

    monkeypatch.setattr(ProcessLists, "read", growing)
    device = reader.read().devices[0]

    assert len(calls) == nvml.LIST_READS
    assert {p.pid: p.used for p in device.processes} == {4242: GiB + 200 * MiB}
    assert device.total == device.reserved + device.used + device.free
