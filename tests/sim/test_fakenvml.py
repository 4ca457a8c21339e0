"""The fake libnvidia-ml.so.1, driven through the real pynvml (and through ctypes where
pynvml would hide what the library does)."""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pynvml
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpugate.core.units import GiB, MiB
from gpugate_sim.device import HostState, SimDevice, SimProcess, SimulatedGpuHost, pid_alive
from gpugate_sim.shim import STATE_ENV
from tests.conftest import CARD_UUID
from tests.sim.processes import sleepers

TOTAL = 16 * GiB
RESERVED = 434 * MiB
NO_INSTANCE = 0xFFFFFFFF
NOT_AVAILABLE = 2**64 - 1


@pytest.fixture
def nvml(fakenvml_loaded: ctypes.CDLL, sim_host: SimulatedGpuHost) -> Iterator[ctypes.CDLL]:
    """pynvml initialised against `sim_host`; yields the library for direct C calls."""
    pynvml.nvmlInit()
    try:
        yield fakenvml_loaded
    finally:
        pynvml.nvmlShutdown()


def handle(index: int = 0) -> object:
    return pynvml.nvmlDeviceGetHandleByIndex(index)


def two_gpu_host(directory: Path, monkeypatch: pytest.MonkeyPatch) -> SimulatedGpuHost:
    host = SimulatedGpuHost.create(
        directory,
        [
            SimDevice(0, TOTAL, RESERVED, CARD_UUID, "NVIDIA GeForce RTX 4080"),
            SimDevice(
                1,
                24 * GiB,
                300 * MiB,
                "GPU-00000000-1111-2222-3333-444444444444",
                "NVIDIA GeForce RTX 3090",
                utilization=37,
                memory_utilization=12,
                power_mw=215_000,
            ),
        ],
    )
    monkeypatch.setenv(STATE_ENV, str(host.state_path))
    return host


# -- loading and identity -------------------------------------------------------------------------


def test_pynvml_calls_into_the_fake_library(nvml: ctypes.CDLL) -> None:
    assert pynvml.nvmlLib._handle == nvml._handle


def test_device_identity(nvml: ctypes.CDLL) -> None:
    assert pynvml.nvmlDeviceGetCount() == 1
    device = handle(0)
    assert pynvml.nvmlDeviceGetName(device) == "NVIDIA GeForce RTX 4080"
    assert pynvml.nvmlDeviceGetUUID(device) == CARD_UUID
    assert pynvml.nvmlDeviceGetIndex(device) == 0
    by_uuid = pynvml.nvmlDeviceGetHandleByUUID(CARD_UUID)
    assert pynvml.nvmlDeviceGetIndex(by_uuid) == 0
    pci = pynvml.nvmlDeviceGetPciInfo(device)
    assert pci.busId == "00000000:01:00.0"
    assert pci.pciDeviceId == 0x270410DE


def test_system_versions_come_from_the_state(
    nvml: ctypes.CDLL, sim_host: SimulatedGpuHost, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert pynvml.nvmlSystemGetDriverVersion() == "550.54.15"
    assert pynvml.nvmlSystemGetNVMLVersion() == "12.550.54.15"
    assert pynvml.nvmlSystemGetCudaDriverVersion() == 12040
    assert pynvml.nvmlSystemGetCudaDriverVersion_v2() == 12040
    other = SimulatedGpuHost.create(
        tmp_path / "other", sim_host.read().devices, driver="535.183.01", cuda=12020
    )
    monkeypatch.setenv(STATE_ENV, str(other.state_path))
    assert pynvml.nvmlSystemGetDriverVersion() == "535.183.01"
    assert pynvml.nvmlSystemGetNVMLVersion() == "12.535.183.01"
    assert pynvml.nvmlSystemGetCudaDriverVersion() == 12020


def test_unknown_uuid_is_not_found(nvml: ctypes.CDLL) -> None:
    with pytest.raises(pynvml.NVMLError_NotFound):
        pynvml.nvmlDeviceGetHandleByUUID("GPU-00000000-0000-0000-0000-000000000000")


def test_handles_are_stable_and_checked_against_the_current_state(
    nvml: ctypes.CDLL, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    host = two_gpu_host(tmp_path / "two", monkeypatch)
    second = handle(1)
    assert (
        ctypes.cast(second, ctypes.c_void_p).value == ctypes.cast(handle(1), ctypes.c_void_p).value
    )
    assert pynvml.nvmlDeviceGetName(second) == "NVIDIA GeForce RTX 3090"
    # The GPU falls off the bus: the state now has one device, and the old handle is stale.
    SimulatedGpuHost.create(host.directory, [host.read().devices[0]])
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlDeviceGetName(second)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        handle(1)


def test_a_pointer_that_is_no_handle_is_an_invalid_argument(nvml: ctypes.CDLL) -> None:
    bogus = ctypes.cast(ctypes.c_void_p(ctypes.addressof(ctypes.c_int())), pynvml.c_nvmlDevice_t)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlDeviceGetName(bogus)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlDeviceGetMemoryInfo(None)


# -- memory --------------------------------------------------------------------------------------


def test_memory_v1_and_v2_relation(nvml: ctypes.CDLL, sim_host: SimulatedGpuHost) -> None:
    sim_host.set_base_used(0, 250 * MiB)
    sim_host.allocate(os.getpid(), 3 * GiB, name="pytest")
    v1 = pynvml.nvmlDeviceGetMemoryInfo(handle())
    v2 = pynvml.nvmlDeviceGetMemoryInfo(handle(), version=pynvml.nvmlMemory_v2)
    used = 250 * MiB + 3 * GiB
    assert (v2.total, v2.reserved, v2.used) == (TOTAL, RESERVED, used)
    assert v2.free == TOTAL - RESERVED - used
    assert v2.total == v2.reserved + v2.used + v2.free
    assert (v1.total, v1.free) == (v2.total, v2.free)
    assert v1.used == v2.used + v2.reserved


def test_memory_changes_are_seen_on_the_next_call(
    nvml: ctypes.CDLL, sim_host: SimulatedGpuHost
) -> None:
    device = handle()
    before = pynvml.nvmlDeviceGetMemoryInfo(device, version=pynvml.nvmlMemory_v2).free
    sim_host.allocate(os.getpid(), GiB)
    assert pynvml.nvmlDeviceGetMemoryInfo(device, version=pynvml.nvmlMemory_v2).free == (
        before - GiB
    )
    sim_host.release(os.getpid())
    assert pynvml.nvmlDeviceGetMemoryInfo(device, version=pynvml.nvmlMemory_v2).free == before


def test_free_is_clamped_at_zero(nvml: ctypes.CDLL, sim_host: SimulatedGpuHost) -> None:
    sim_host.set_base_used(0, TOTAL)
    v2 = pynvml.nvmlDeviceGetMemoryInfo(handle(), version=pynvml.nvmlMemory_v2)
    v1 = pynvml.nvmlDeviceGetMemoryInfo(handle())
    assert (v2.free, v1.free) == (0, 0)
    assert v2.used == TOTAL


def test_memory_v2_checks_the_struct_version(nvml: ctypes.CDLL) -> None:
    memory = pynvml.c_nvmlMemory_v2_t()
    memory.version = 0x01000028
    assert nvml.nvmlDeviceGetMemoryInfo_v2(handle(), ctypes.byref(memory)) == 25
    assert memory.total == 0
    with pytest.raises(pynvml.NVMLError_ArgumentVersionMismatch):
        pynvml.nvmlDeviceGetMemoryInfo(handle(), version=0x01000028)


# -- processes -----------------------------------------------------------------------------------


def test_compute_and_graphics_lists(nvml: ctypes.CDLL, sim_host: SimulatedGpuHost) -> None:
    with sleepers(3) as (compute, graphics, both):
        sim_host.allocate(compute.pid, 2050 * MiB, name="whisper-server")
        sim_host.add_process(SimProcess(0, graphics.pid, -1, "G", "Xorg"))
        sim_host.add_process(SimProcess(0, both.pid, 512 * MiB, "CG", "kwin_wayland"))
        device = handle()
        computes = pynvml.nvmlDeviceGetComputeRunningProcesses(device)
        graphics_list = pynvml.nvmlDeviceGetGraphicsRunningProcesses(device)
        assert {(p.pid, p.usedGpuMemory) for p in computes} == {
            (compute.pid, 2050 * MiB),
            (both.pid, 512 * MiB),
        }
        assert {(p.pid, p.usedGpuMemory) for p in graphics_list} == {
            (graphics.pid, None),
            (both.pid, 512 * MiB),
        }
        for p in [*computes, *graphics_list]:
            assert (p.gpuInstanceId, p.computeInstanceId) == (NO_INSTANCE, NO_INSTANCE)
        assert pynvml.nvmlSystemGetProcessName(compute.pid) == "whisper-server"
        assert pynvml.nvmlSystemGetProcessName(graphics.pid) == "Xorg"
        # A process of unknown size still counts once, and adds nothing to `used`.
        v2 = pynvml.nvmlDeviceGetMemoryInfo(device, version=pynvml.nvmlMemory_v2)
        assert v2.used == 2050 * MiB + 512 * MiB
        assert pynvml.nvmlDeviceGetMPSComputeRunningProcesses(device) == []


def test_process_name_of_an_unknown_pid_is_not_found(nvml: ctypes.CDLL) -> None:
    with sleepers(1) as (stranger,), pytest.raises(pynvml.NVMLError_NotFound):
        pynvml.nvmlSystemGetProcessName(stranger.pid)


def test_a_process_without_a_name_is_named_by_its_comm(
    nvml: ctypes.CDLL, sim_host: SimulatedGpuHost
) -> None:
    with sleepers(1) as (proc,):
        sim_host.allocate(proc.pid, MiB)
        assert pynvml.nvmlSystemGetProcessName(proc.pid) == "sleep"


@pytest.mark.parametrize("count", [0, 1, 7])
def test_sizing_protocol_through_pynvml(
    nvml: ctypes.CDLL, sim_host: SimulatedGpuHost, count: int
) -> None:
    with sleepers(count) as procs:
        for i, proc in enumerate(procs):
            sim_host.allocate(proc.pid, (i + 1) * MiB, name=f"job{i}")
        listed = pynvml.nvmlDeviceGetComputeRunningProcesses(handle())
        assert sorted((p.pid, p.usedGpuMemory) for p in listed) == sorted(
            (proc.pid, (i + 1) * MiB) for i, proc in enumerate(procs)
        )


@pytest.mark.parametrize("count", [0, 1, 7])
def test_sizing_protocol_in_c(nvml: ctypes.CDLL, sim_host: SimulatedGpuHost, count: int) -> None:
    fn = nvml.nvmlDeviceGetComputeRunningProcesses_v3
    with sleepers(count) as procs:
        for proc in procs:
            sim_host.allocate(proc.pid, MiB)
        n = ctypes.c_uint(0)
        code = fn(handle(), ctypes.byref(n), None)
        assert (code, n.value) == ((0, 0) if count == 0 else (7, count))
        if count == 0:
            return
        short = ctypes.c_uint(count - 1)
        buffer = (pynvml.c_nvmlProcessInfo_t * (count + 1))()
        buffer[count - 1].pid = 0xDEAD
        assert fn(handle(), ctypes.byref(short), buffer) == 7
        assert short.value == count
        assert buffer[count - 1].pid == 0xDEAD, "nothing is written when the buffer is short"
        exact = ctypes.c_uint(count)
        buffer[count].pid = 0xBEEF  # one past what may be written
        assert fn(handle(), ctypes.byref(exact), buffer) == 0
        assert exact.value == count
        assert sorted(buffer[i].pid for i in range(count)) == sorted(p.pid for p in procs)
        assert buffer[count].pid == 0xBEEF


def test_dead_pids_and_their_bytes_vanish(nvml: ctypes.CDLL, sim_host: SimulatedGpuHost) -> None:
    device = handle()
    free_before = pynvml.nvmlDeviceGetMemoryInfo(device, version=pynvml.nvmlMemory_v2).free
    proc = subprocess.Popen(["sleep", "600"])
    try:
        sim_host.allocate(proc.pid, 2 * GiB, name="comfyui")
        assert [p.pid for p in pynvml.nvmlDeviceGetComputeRunningProcesses(device)] == [proc.pid]
        assert pynvml.nvmlDeviceGetMemoryInfo(device, version=pynvml.nvmlMemory_v2).free == (
            free_before - 2 * GiB
        )
        proc.kill()
        # Wait for the exit without reaping: the zombie is still in /proc, but the driver
        # has already freed its memory.
        os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOWAIT)
        assert Path(f"/proc/{proc.pid}").exists()
        assert pynvml.nvmlDeviceGetComputeRunningProcesses(device) == []
        assert pynvml.nvmlDeviceGetMemoryInfo(device, version=pynvml.nvmlMemory_v2).free == (
            free_before
        )
    finally:
        proc.kill()
        proc.wait(timeout=10)
    assert not Path(f"/proc/{proc.pid}").exists()
    assert pynvml.nvmlDeviceGetComputeRunningProcesses(device) == []
    with pytest.raises(pynvml.NVMLError_NotFound):
        pynvml.nvmlSystemGetProcessName(proc.pid)


def test_check_pids_off_keeps_rows_of_missing_pids(
    nvml: ctypes.CDLL, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    proc = subprocess.Popen(["true"])
    proc.wait(timeout=10)
    host = SimulatedGpuHost.create(
        tmp_path / "nocheck", [SimDevice(0, TOTAL, RESERVED, CARD_UUID, "card")], check_pids=False
    )
    host.add_process(SimProcess(0, proc.pid, GiB, "C", "gone"))
    monkeypatch.setenv(STATE_ENV, str(host.state_path))
    listed = pynvml.nvmlDeviceGetComputeRunningProcesses(handle())
    assert [(p.pid, p.usedGpuMemory) for p in listed] == [(proc.pid, GiB)]


# -- errors --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("code", "error"),
    [
        (9, pynvml.NVMLError_DriverNotLoaded),
        (18, pynvml.NVMLError_LibRmVersionMismatch),
        (4, pynvml.NVMLError_NoPermission),
    ],
)
def test_init_error(
    fakenvml_loaded: ctypes.CDLL, sim_host: SimulatedGpuHost, code: int, error: type[Exception]
) -> None:
    sim_host.set_init_error(code)
    with pytest.raises(error):
        pynvml.nvmlInit()
    # A failed init takes no reference: nothing works until one succeeds.
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        pynvml.nvmlDeviceGetCount()
    sim_host.clear_injections()
    pynvml.nvmlInit()
    try:
        assert pynvml.nvmlDeviceGetCount() == 1
    finally:
        pynvml.nvmlShutdown()


def test_missing_state_file_is_driver_not_loaded(
    fakenvml_loaded: ctypes.CDLL,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capfd: pytest.CaptureFixture[str],
) -> None:
    missing = tmp_path / "nowhere" / "nvml.state"
    monkeypatch.setenv(STATE_ENV, str(missing))
    with pytest.raises(pynvml.NVMLError_DriverNotLoaded):
        pynvml.nvmlInit()
    assert f"fakenvml: {missing}: cannot open: No such file or directory" in capfd.readouterr().err
    monkeypatch.delenv(STATE_ENV)
    with pytest.raises(pynvml.NVMLError_DriverNotLoaded):
        pynvml.nvmlInit()
    assert "GPUGATE_FAKE_NVML_STATE: not set" in capfd.readouterr().err


def test_unparsable_state_names_the_line(
    nvml: ctypes.CDLL, sim_host: SimulatedGpuHost, capfd: pytest.CaptureFixture[str]
) -> None:
    good = sim_host.state_path.read_text()
    lines = good.splitlines()
    sim_host.state_path.write_text("\n".join([*lines, "proc 0 X 1234 5 bad kind"]) + "\n")
    bad_line = len(lines) + 1
    # Initialised before the file broke: calls now fail with UNKNOWN.
    with pytest.raises(pynvml.NVMLError_Unknown):
        pynvml.nvmlDeviceGetCount()
    with pytest.raises(pynvml.NVMLError_Unknown):
        pynvml.nvmlDeviceGetCount()
    err = capfd.readouterr().err
    expected = f"fakenvml: {sim_host.state_path}: line {bad_line}: proc: kind must be C, G or CG"
    assert err.count(expected) == 1, err
    # And a fresh init is refused as if no driver were loaded.
    with pytest.raises(pynvml.NVMLError_DriverNotLoaded):
        pynvml.nvmlInit()
    sim_host.state_path.write_text(good)
    assert pynvml.nvmlDeviceGetCount() == 1


def test_uninitialized_after_shutdown(
    fakenvml_loaded: ctypes.CDLL, sim_host: SimulatedGpuHost
) -> None:
    pynvml.nvmlInit()
    pynvml.nvmlInit()
    pynvml.nvmlShutdown()
    assert pynvml.nvmlDeviceGetCount() == 1, "one reference is left"
    pynvml.nvmlShutdown()
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        pynvml.nvmlDeviceGetCount()
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        pynvml.nvmlSystemGetDriverVersion()
    assert fakenvml_loaded.nvmlShutdown() == 0, "an extra shutdown is not an error"


@pytest.mark.parametrize(
    ("symbol", "code", "call", "error"),
    [
        (
            "nvmlDeviceGetMemoryInfo_v2",
            15,
            lambda h: pynvml.nvmlDeviceGetMemoryInfo(h, version=pynvml.nvmlMemory_v2),
            pynvml.NVMLError_GpuIsLost,
        ),
        (
            "nvmlDeviceGetMemoryInfo_v2",
            13,
            lambda h: pynvml.nvmlDeviceGetMemoryInfo(h, version=pynvml.nvmlMemory_v2),
            pynvml.NVMLError_FunctionNotFound,
        ),
        (
            "nvmlDeviceGetComputeRunningProcesses_v3",
            15,
            pynvml.nvmlDeviceGetComputeRunningProcesses,
            pynvml.NVMLError_GpuIsLost,
        ),
        ("nvmlDeviceGetName", 15, pynvml.nvmlDeviceGetName, pynvml.NVMLError_GpuIsLost),
        (
            "nvmlDeviceGetPowerUsage",
            3,
            pynvml.nvmlDeviceGetPowerUsage,
            pynvml.NVMLError_NotSupported,
        ),
    ],
)
def test_injected_device_errors(
    nvml: ctypes.CDLL,
    sim_host: SimulatedGpuHost,
    symbol: str,
    code: int,
    call,
    error: type[Exception],
) -> None:
    call(handle())
    sim_host.inject(symbol, code, gpu=0)
    with pytest.raises(error) as caught:
        call(handle())
    assert caught.value.value == code
    # Other calls on the same device keep working.
    assert pynvml.nvmlDeviceGetMemoryInfo(handle()).total == TOTAL
    sim_host.clear_injections()
    call(handle())


def test_function_not_found_is_the_same_for_an_injected_and_a_missing_symbol(
    nvml: ctypes.CDLL, sim_host: SimulatedGpuHost
) -> None:
    sim_host.inject("nvmlDeviceGetMemoryInfo_v2", 13)
    with pytest.raises(pynvml.NVMLError_FunctionNotFound):
        pynvml.nvmlDeviceGetMemoryInfo(handle(), version=pynvml.nvmlMemory_v2)
    with pytest.raises(pynvml.NVMLError_FunctionNotFound):
        pynvml.nvmlDeviceGetFanSpeed(handle())  # the library does not export it
    assert pynvml.nvmlDeviceGetMemoryInfo(handle()).total == TOTAL, "v1 is the fallback"


def test_injection_on_one_gpu_leaves_the_other(
    nvml: ctypes.CDLL, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    host = two_gpu_host(tmp_path / "two", monkeypatch)
    host.inject("nvmlDeviceGetUUID", 15, gpu=1)
    assert pynvml.nvmlDeviceGetUUID(handle(0)) == CARD_UUID
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        pynvml.nvmlDeviceGetUUID(handle(1))
    host.inject("nvmlDeviceGetUUID", 2)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlDeviceGetUUID(handle(0))


def test_injected_system_error(nvml: ctypes.CDLL, sim_host: SimulatedGpuHost) -> None:
    sim_host.inject("nvmlSystemGetDriverVersion", 999)
    with pytest.raises(pynvml.NVMLError_Unknown):
        pynvml.nvmlSystemGetDriverVersion()
    assert pynvml.nvmlSystemGetCudaDriverVersion() == 12040


def test_a_lost_gpu_stays_lost_until_nvml_is_initialised_again(
    fakenvml_loaded: ctypes.CDLL, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    host = two_gpu_host(tmp_path / "two", monkeypatch)
    pynvml.nvmlInit()
    try:
        host.lose(1)
        assert pynvml.nvmlDeviceGetUUID(handle(0)) == CARD_UUID
        with pytest.raises(pynvml.NVMLError_GpuIsLost):
            pynvml.nvmlDeviceGetMemoryInfo(handle(1))
        host.clear_injections()
        # The card is back, but not for this initialisation.
        with pytest.raises(pynvml.NVMLError_GpuIsLost):
            pynvml.nvmlDeviceGetHandleByIndex(1)
        assert pynvml.nvmlDeviceGetCount() == 2
    finally:
        pynvml.nvmlShutdown()
    pynvml.nvmlInit()
    try:
        assert pynvml.nvmlDeviceGetMemoryInfo(handle(1)).total == 24 * GiB
    finally:
        pynvml.nvmlShutdown()


def test_a_stalled_call_blocks_then_answers(nvml: ctypes.CDLL, sim_host: SimulatedGpuHost) -> None:
    # A stall long enough that no pause of a busy machine passes for it.
    sim_host.stall("nvmlDeviceGetMemoryInfo_v2", 1500, gpu=0)
    started = time.monotonic()
    memory = pynvml.nvmlDeviceGetMemoryInfo(handle(), version=pynvml.nvmlMemory_v2)
    took = time.monotonic() - started
    assert memory.total == TOTAL and took >= 1.5
    started = time.monotonic()
    pynvml.nvmlDeviceGetName(handle())  # another call: not stalled
    assert time.monotonic() - started < 1.5


def test_bad_index(nvml: ctypes.CDLL) -> None:
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlDeviceGetHandleByIndex(1)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlDeviceGetHandleByIndex(2**32 - 1)


def test_strings_need_room_for_the_terminator(nvml: ctypes.CDLL) -> None:
    name = "NVIDIA GeForce RTX 4080"
    buffer = ctypes.create_string_buffer(64)
    assert nvml.nvmlDeviceGetName(handle(), buffer, ctypes.c_uint(len(name))) == 7
    assert nvml.nvmlDeviceGetName(handle(), buffer, ctypes.c_uint(len(name) + 1)) == 0
    assert buffer.value.decode() == name
    assert nvml.nvmlSystemGetDriverVersion(buffer, ctypes.c_uint(3)) == 7


def test_mig_is_not_supported(nvml: ctypes.CDLL) -> None:
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetMigMode(handle())
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetMaxMigDeviceCount(handle())
    assert pynvml.nvmlDeviceIsMigDeviceHandle(handle()).value == 0


def test_utilization_and_power(
    nvml: ctypes.CDLL, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    two_gpu_host(tmp_path / "two", monkeypatch)
    busy = pynvml.nvmlDeviceGetUtilizationRates(handle(1))
    assert (busy.gpu, busy.memory) == (37, 12)
    assert pynvml.nvmlDeviceGetPowerUsage(handle(1)) == 215_000
    idle = pynvml.nvmlDeviceGetUtilizationRates(handle(0))
    assert (idle.gpu, idle.memory) == (0, 0)


# -- the ABI -------------------------------------------------------------------------------------


def test_struct_layouts_match_pynvml() -> None:
    assert ctypes.sizeof(pynvml.c_nvmlMemory_t) == 24
    assert ctypes.sizeof(pynvml.c_nvmlMemory_v2_t) == 40
    assert pynvml.c_nvmlMemory_v2_t.used.offset == 32
    assert pynvml.nvmlMemory_v2 == 0x02000028
    assert ctypes.sizeof(pynvml.c_nvmlProcessInfo_t) == 24
    assert pynvml.c_nvmlProcessInfo_t.computeInstanceId.offset == 20
    assert ctypes.sizeof(pynvml.c_nvmlUtilization_t) == 8
    assert ctypes.sizeof(pynvml.nvmlPciInfo_t) == 68


@pytest.mark.parametrize(
    ("symbol", "struct", "version"),
    [
        ("nvmlDeviceGetMemoryInfo", pynvml.c_nvmlMemory_t, None),
        ("nvmlDeviceGetMemoryInfo_v2", pynvml.c_nvmlMemory_v2_t, pynvml.nvmlMemory_v2),
        ("nvmlDeviceGetUtilizationRates", pynvml.c_nvmlUtilization_t, None),
        ("nvmlDeviceGetPciInfo_v3", pynvml.nvmlPciInfo_t, None),
    ],
)
def test_the_library_writes_exactly_pynvmls_struct(
    nvml: ctypes.CDLL,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    symbol: str,
    struct: type[ctypes.Structure],
    version: int | None,
) -> None:
    two_gpu_host(tmp_path / "two", monkeypatch)
    device = handle(1)
    size = ctypes.sizeof(struct)
    guard = b"\xa5" * 16
    # Fields the library forgets to write keep this pattern and fail the comparison.
    raw = ctypes.create_string_buffer(b"\x5a" * size + guard, size + len(guard))
    view = struct.from_buffer(raw)
    expected = struct()
    if version is not None:
        view.version = expected.version = version
    assert getattr(nvml, symbol)(device, ctypes.byref(view)) == 0
    assert getattr(nvml, symbol)(device, ctypes.byref(expected)) == 0
    assert raw.raw[size:] == guard
    for field, *_ in struct._fields_:
        assert getattr(view, field) == getattr(expected, field), field


# -- threads -------------------------------------------------------------------------------------


def test_threads_read_consistent_states_while_the_state_changes(
    nvml: ctypes.CDLL, sim_host: SimulatedGpuHost
) -> None:
    pid = os.getpid()
    sim_host.allocate(pid, GiB, name="base")
    pulse = 512 * MiB
    allowed_used = {GiB, GiB + pulse}
    seen: set[int] = set()
    errors: list[BaseException] = []
    readers_done = threading.Event()
    writes = 0

    def reader() -> None:
        device = handle()
        try:
            for i in range(1000):
                if i % 2:
                    used = pynvml.nvmlDeviceGetMemoryInfo(device, version=pynvml.nvmlMemory_v2)
                    assert used.used in allowed_used
                    assert used.free == TOTAL - RESERVED - used.used
                    seen.add(used.used)
                else:
                    (proc,) = pynvml.nvmlDeviceGetComputeRunningProcesses(device)
                    assert (proc.pid, proc.usedGpuMemory in allowed_used) == (pid, True)
        except BaseException as exc:
            errors.append(exc)

    def writer() -> None:
        nonlocal writes
        while not readers_done.is_set():
            sim_host.allocate(pid, pulse)
            sim_host.release(pid, pulse)
            writes += 2

    threads = [threading.Thread(target=reader) for _ in range(4)]
    rewriting = threading.Thread(target=writer)
    rewriting.start()
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    readers_done.set()
    rewriting.join(timeout=60)
    assert not errors, errors[:3]
    assert writes >= 10, "the state must have changed while the readers ran"
    assert seen == allowed_used


# -- loading in other processes ------------------------------------------------------------------


PROBE = """
import pynvml
try:
    pynvml.nvmlInit()
except pynvml.NVMLError_LibraryNotFound:
    print("LibraryNotFound")
else:
    print(pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(0)))
    pynvml.nvmlShutdown()
"""


def test_library_not_found_without_the_library_path(subprocess_env: dict[str, str]) -> None:
    env = {**subprocess_env, "LD_LIBRARY_PATH": ""}
    out = subprocess.run(
        [sys.executable, "-c", PROBE],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert out.stdout.strip() == "LibraryNotFound"


def test_a_subprocess_finds_the_library_through_ld_library_path(
    subprocess_env: dict[str, str],
) -> None:
    out = subprocess.run(
        [sys.executable, "-c", PROBE],
        env=subprocess_env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert out.stdout.strip() == "NVIDIA GeForce RTX 4080"


# -- the C parser agrees with the Python one ---------------------------------------------------


_GOOD_FILE = [
    "# a comment",
    "driver 550.54.15",
    "cuda 12040",
    "check_pids 1",
    "device 0 17179869184 455081984 0 GPU-a NVIDIA GeForce RTX 4080",
    "device 1 25769803776 0 1048576 GPU-b NVIDIA GeForce RTX 3090 # second",
    "",
    "device 2 1 0 0 GPU-c tiny",
    "util 0 50 20",
    "power 1 215000",
    "proc 0 C 1 1073741824 whisper-server",
    "proc 0 G 1 -1 Xorg",
    "proc 1 CG 1 5 kwin # wayland",
    "proc 0 C 1 7",
    "fail * nvmlDeviceGetFanSpeed 3",
    "fail 1 nvmlDeviceGetPowerUsage 15 # lost",
    "stall * nvmlDeviceGetFanSpeed 5",
    "stall 0 nvmlDeviceGetPowerUsage 1000 # hung",
    "lost 2",
]
_TOKENS = [
    "",
    "x",
    "-1",
    "-0",
    "+5",
    "#",
    "*",
    "C",
    "CG",
    "0",
    "1",
    "16",
    "2147483648",
    "99999999999999999999",
    "18446744073709551615",
    "a" * 96,
    "b" * 300,
]


@st.composite
def _state_texts(draw: st.DrawFn) -> str:
    """Some lines of a good file, in order, with a few words replaced by odd ones."""
    mostly = st.integers(0, 4).map(bool)
    keep = draw(st.lists(mostly, min_size=len(_GOOD_FILE), max_size=len(_GOOD_FILE)))
    lines = [line for line, kept in zip(_GOOD_FILE, keep, strict=True) if kept]
    for _ in range(draw(st.integers(0, 2))):
        if not lines:
            break
        at = draw(st.integers(0, len(lines) - 1))
        words = lines[at].split(" ")
        words[draw(st.integers(0, len(words) - 1))] = draw(st.sampled_from(_TOKENS))
        lines[at] = " ".join(words)
    return "\n".join(lines) + "\n"


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(text=_state_texts())
def test_the_c_and_python_parsers_accept_the_same_files(
    fakenvml_loaded: ctypes.CDLL, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text: str
) -> None:
    # No reference held across examples: each one's shutdown ends a `lost` device's loss.
    nvml = fakenvml_loaded
    pynvml._LoadNvmlLibrary()
    path = tmp_path / "fuzz.state"
    path.write_text(text)
    monkeypatch.setenv(STATE_ENV, str(path))
    try:
        state: HostState | None = HostState.parse(text)
    except ValueError:
        state = None
    if state is not None and state.check_pids:
        state.processes = [p for p in state.processes if pid_alive(p.pid)]
    code = nvml.nvmlInitWithFlags(0)
    if code != 0:
        assert state is None, f"C refused ({code}) what Python accepts:\n{text}"
        assert code == 9
        return
    try:
        assert state is not None, f"C accepted what Python refuses:\n{text}"
        assert pynvml.nvmlDeviceGetCount() == len(state.devices)
        for device in state.devices:
            if device.index in state.lost or None in state.lost:
                with pytest.raises(pynvml.NVMLError_GpuIsLost):
                    handle(device.index)
                continue
            h = handle(device.index)
            assert pynvml.nvmlDeviceGetName(h) == device.name
            assert pynvml.nvmlDeviceGetUUID(h) == device.uuid
            memory = pynvml.nvmlDeviceGetMemoryInfo(h, version=pynvml.nvmlMemory_v2)
            # The library saturates a sum that does not fit in 64 bits.
            used = min(state.used(device.index), 2**64 - 1)
            free = max(0, device.total - device.reserved - used)
            assert (memory.total, memory.used, memory.free) == (device.total, used, free)
    finally:
        nvml.nvmlShutdown()
