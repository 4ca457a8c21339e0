"""Host observations: reads off the loop, coalesced, on a fixed grid, attributed end to end."""

from __future__ import annotations

import asyncio
import ctypes
import os
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Collection
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpugate.config.model import (
    BudgetSettings,
    Config,
    ExternalService,
    GateSettings,
    ProcessMatch,
)
from gpugate.core.observation import (
    OTHER,
    UNATTRIBUTED,
    DriverFault,
    HostObservation,
    Owner,
    OwnerKind,
)
from gpugate.core.units import GiB, MiB
from gpugate.gpu import nvml
from gpugate.gpu import sampler as sampler_module
from gpugate.gpu.attribution import Attribution, ProcessAttributor
from gpugate.gpu.nvml import (
    ContextKind,
    DeviceSample,
    HostSample,
    MemoryApi,
    NvmlError,
    NvmlReader,
    ProcessSample,
)
from gpugate.gpu.sampler import HURRY_EVERY, Sampler, next_delay, next_tick
from gpugate_sim.device import SimDevice, SimProcess, SimulatedGpuHost
from gpugate_sim.shim import STATE_ENV
from tests.gpu.proctree import ProcTree
from tests.gpu.support import consumer

WAIT = 5.0
"""Upper bound for any single wait in these tests; reached only when something is broken."""


def device(pids: tuple[int, ...] = ()) -> DeviceSample:
    processes = tuple(ProcessSample(pid, MiB, ContextKind.COMPUTE) for pid in pids)
    return DeviceSample(
        0, "GPU-0", "card", 16 * GiB, 0, len(pids) * MiB, 0, MemoryApi.V2, processes
    )


class InstantReader:
    """Answers at once, numbering its reads in `driver_version`, and notes the thread."""

    def __init__(self, delay: float = 0.0) -> None:
        self.delay = delay
        self.calls = 0
        self.threads: list[int] = []
        self.closed = False

    def read(self) -> HostSample:
        self.threads.append(threading.get_ident())
        if self.delay:
            time.sleep(self.delay)  # how long the driver takes to answer
        self.calls += 1
        return HostSample(str(self.calls), (device(),))

    def close(self) -> None:
        self.closed = True


class GatedReader:
    """Each read announces itself, then waits until the test lets it finish."""

    def __init__(self) -> None:
        self.entered = threading.Semaphore(0)
        self.proceed = threading.Semaphore(0)
        self.calls = 0
        self.active = 0
        self.most_active = 0
        self.closed = False
        self._lock = threading.Lock()

    def read(self) -> HostSample:
        with self._lock:
            self.calls += 1
            number = self.calls
            self.active += 1
            self.most_active = max(self.most_active, self.active)
        self.entered.release()
        released = self.proceed.acquire(timeout=WAIT)
        with self._lock:
            self.active -= 1
        if not released:
            raise RuntimeError("the test never let this read finish")
        return HostSample(str(number), (device(),))

    def close(self) -> None:
        self.closed = True

    async def wait_entered(self) -> None:
        assert await asyncio.to_thread(self.entered.acquire, True, WAIT)

    def release(self) -> None:
        self.proceed.release()


class FailingReader:
    def __init__(self, error: NvmlError) -> None:
        self.error = error

    def read(self) -> HostSample:
        raise self.error

    def close(self) -> None:
        pass


@pytest.fixture
def nobody(tmp_path: Path) -> ProcessAttributor:
    """Attributes every PID to `other` (its proc tree is empty)."""
    return ProcessAttributor(proc_root=tmp_path / "empty-proc")


class ManualClock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


# -- one sample ------------------------------------------------------------------------


async def test_read_runs_in_a_worker_thread(nobody: ProcessAttributor) -> None:
    reader = InstantReader()
    sampler = Sampler(reader, nobody)

    observation = await sampler.sample()

    assert observation.driver_version == "1"
    assert reader.threads and threading.get_ident() not in reader.threads


async def test_taken_at_is_stamped_when_the_read_began(nobody: ProcessAttributor) -> None:
    clock, wall = ManualClock(10.0), ManualClock(1.7e9)

    class AdvancingReader(InstantReader):
        def read(self) -> HostSample:
            sample = super().read()
            clock.now, wall.now = 12.5, 1.7e9 + 2.5  # the driver took 2.5 s
            return sample

    sampler = Sampler(AdvancingReader(), nobody, clock=clock, wall_clock=wall)

    observation = await sampler.sample()

    # A read that hangs for longer than stale_after must arrive already stale.
    assert (observation.taken_at, observation.wall_time) == (10.0, 1.7e9)
    assert sampler.latest is observation


class ScriptedReader:
    """Answers each read with the next of `samples` (the last one from then on)."""

    def __init__(self, *samples: HostSample) -> None:
        self.samples = list(samples)
        self.calls = 0

    def read(self) -> HostSample:
        self.calls += 1
        return self.samples[min(self.calls, len(self.samples)) - 1]

    def close(self) -> None:
        pass


def runner_tree(tmp_path: Path) -> tuple[ProcTree, ProcessAttributor]:
    """Ollama (pid 812) and its runner (9001) in a fake proc tree, and their attributor."""
    tree = ProcTree(tmp_path / "proc")
    tree.add(812, comm="ollama", argv=["/usr/bin/ollama", "serve"])
    tree.add(9001, ppid=812, comm="llama-server", argv=["/usr/lib/ollama/llama-server"])
    rule = ProcessMatch(commands=("/usr/bin/ollama",))
    return tree, ProcessAttributor([consumer("ollama", rule, 11434)], [], proc_root=tree.root)


def card(*processes: tuple[int, int]) -> HostSample:
    listed = tuple(ProcessSample(pid, used, ContextKind.COMPUTE) for pid, used in processes)
    used = sum(nbytes for _, nbytes in processes)
    return HostSample(
        "1",
        (
            DeviceSample(
                0, "GPU-0", "card", 16 * GiB, 0, used, 16 * GiB - used, MemoryApi.V2, listed
            ),
        ),
    )


async def test_a_process_that_exits_between_the_driver_and_proc_is_read_again(
    tmp_path: Path,
) -> None:
    # A runner NVML lists whose /proc entry is gone by the time it is read, never seen
    # before: the driver frees its memory as it exits, so the read is taken again and the
    # bytes are not `other` on top of its model's (which reads as pressure).
    tree, attributor = runner_tree(tmp_path)
    tree.add(9002, ppid=812, comm="llama-server")
    first = card((9001, 7796 * MiB))
    reader = ScriptedReader(first, card((9001, 7796 * MiB), (9002, 5700 * MiB)))
    sampler = Sampler(reader, attributor)
    assert (await sampler.sample()).device(0).managed == {"ollama": 7796 * MiB}
    tree.remove(9002)  # it exits after the driver listed it
    reader.samples.append(first)  # the next read no longer lists it
    gpu = (await sampler.sample()).device(0)
    assert reader.calls == 3
    assert gpu.managed == {"ollama": 7796 * MiB}
    assert gpu.external == {}
    assert gpu.used == 7796 * MiB


async def test_a_process_that_stays_out_of_proc_is_read_twice_once_then_counted_other(
    tmp_path: Path,
) -> None:
    # Another PID namespace's process is never in this /proc: its bytes are `other`, and
    # only the first sample that lists it reads the driver twice.
    _, attributor = runner_tree(tmp_path)
    reader = ScriptedReader(card((9001, 7796 * MiB), (4242, 512 * MiB)))
    sampler = Sampler(reader, attributor)
    first = (await sampler.sample()).device(0)
    assert reader.calls == 2
    second = (await sampler.sample()).device(0)
    assert reader.calls == 3
    for gpu in (first, second):
        assert gpu.managed == {"ollama": 7796 * MiB}
        assert gpu.external == {OTHER: 512 * MiB}


async def test_an_exited_process_seen_before_keeps_its_owner_without_a_second_read(
    tmp_path: Path,
) -> None:
    tree, attributor = runner_tree(tmp_path)
    reader = ScriptedReader(card((9001, 7796 * MiB)))
    sampler = Sampler(reader, attributor)
    await sampler.sample()
    tree.remove(9001)  # gone from /proc, its memory not back yet: still Ollama's
    gpu = (await sampler.sample()).device(0)
    assert reader.calls == 2
    assert gpu.managed == {"ollama": 7796 * MiB}


async def test_driver_error_becomes_an_observation(nobody: ProcessAttributor) -> None:
    error = NvmlError(15, "NVMLError_GpuIsLost", "nvmlDeviceGetMemoryInfo_v2", "GPU is lost", 0)
    sampler = Sampler(FailingReader(error), nobody, clock=ManualClock(3.0))

    observation = await sampler.sample()

    assert observation.devices == ()
    assert observation.error == DriverFault(
        15, "NVMLError_GpuIsLost", "GPU 0: GPU is lost", "nvmlDeviceGetMemoryInfo_v2", 0
    )
    assert observation.taken_at == 3.0
    assert sampler.latest is observation


def test_sample_blocking_needs_no_event_loop(nobody: ProcessAttributor) -> None:
    reader = InstantReader()

    observation = Sampler(reader, nobody).sample_blocking()

    assert observation.devices[0].uuid == "GPU-0"
    assert reader.threads == [threading.get_ident()]


def test_close_releases_the_reader(nobody: ProcessAttributor) -> None:
    reader = InstantReader()

    Sampler(reader, nobody).close()

    assert reader.closed


async def test_a_read_queued_when_the_sampler_closes_does_not_reopen_nvml(
    nobody: ProcessAttributor,
) -> None:
    reader = GatedReader()
    sampler = Sampler(reader, nobody)
    running = asyncio.ensure_future(sampler.sample())
    await reader.wait_entered()
    queued = asyncio.ensure_future(sampler.sample())
    # The gate stops: close waits for the read in progress, which the driver now finishes.
    closing = asyncio.ensure_future(asyncio.to_thread(sampler.close))
    reader.proceed.release()
    await asyncio.wait_for(closing, WAIT)
    assert (await running).error is None
    after = await asyncio.wait_for(queued, WAIT)
    assert after.error is not None and after.error.message == "the sampler is closed"
    assert (reader.calls, reader.closed) == (1, True)


# -- coalescing ------------------------------------------------------------------------


async def test_callers_during_a_read_share_the_next_read(nobody: ProcessAttributor) -> None:
    reader = GatedReader()
    sampler = Sampler(reader, nobody)
    first = asyncio.create_task(sampler.sample())
    await reader.wait_entered()

    waiting = [asyncio.create_task(sampler.sample()) for _ in range(3)]
    await asyncio.sleep(0)  # one loop turn: each task reaches its first await
    reader.release()
    assert (await first).driver_version == "1"
    await reader.wait_entered()
    reader.release()
    results = await asyncio.gather(*waiting)

    # Each caller got a read that began after it asked, and it was one read for all three.
    assert [r.driver_version for r in results] == ["2", "2", "2"]
    assert results[0] is results[1] is results[2]
    assert (reader.calls, reader.most_active) == (2, 1)


async def test_idle_sampler_reads_at_once_for_each_caller(nobody: ProcessAttributor) -> None:
    reader = InstantReader()
    sampler = Sampler(reader, nobody)

    results = [await sampler.sample() for _ in range(3)]

    assert [r.driver_version for r in results] == ["1", "2", "3"]


async def test_a_caller_giving_up_does_not_cancel_the_shared_read(
    nobody: ProcessAttributor,
) -> None:
    reader = GatedReader()
    sampler = Sampler(reader, nobody)
    first = asyncio.create_task(sampler.sample())
    await reader.wait_entered()
    quitter = asyncio.create_task(sampler.sample())
    stayer = asyncio.create_task(sampler.sample())
    await asyncio.sleep(0)  # one loop turn: both are queued for the next read

    quitter.cancel()
    reader.release()
    await reader.wait_entered()
    reader.release()

    assert (await first).driver_version == "1"
    assert (await stayer).driver_version == "2"
    with pytest.raises(asyncio.CancelledError):
        await quitter
    assert (reader.calls, reader.active) == (2, 0)


# -- sampling forever ------------------------------------------------------------------


async def test_run_keeps_a_fixed_grid_despite_slow_reads(
    nobody: ProcessAttributor, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Every wait is measured from the run's start, not from the end of the last (slow)
    # read: next_delay (whose grid the property test below checks) is always asked about
    # the same start, with the clock as it is after the read.
    sampler = Sampler(InstantReader(delay=0.01), nobody)
    asked: list[tuple[float, float, float]] = []
    done = asyncio.Event()

    def recorded(start: float, interval: float, now: float, hurry_until: float) -> float:
        asked.append((start, interval, now))
        if len(asked) == 4:
            done.set()
        return 0.0

    monkeypatch.setattr(sampler_module, "next_delay", recorded)
    task = asyncio.create_task(sampler.run(0.06, lambda _: None))
    await asyncio.wait_for(done.wait(), WAIT)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task

    starts = {start for start, _, _ in asked}
    assert len(starts) == 1 and {interval for _, interval, _ in asked} == {0.06}
    (start,) = starts
    nows = [now for _, _, now in asked]
    # Each asked after a read that took its 10 ms: the clock moved, the grid did not.
    assert nows == sorted(nows) and nows[0] >= start + 0.01


async def test_poke_samples_at_once(nobody: ProcessAttributor) -> None:
    reader = InstantReader()
    sampler = Sampler(reader, nobody)
    samples: asyncio.Queue[HostObservation] = asyncio.Queue()
    task = asyncio.create_task(sampler.run(3600.0, samples.put_nowait))
    await asyncio.wait_for(samples.get(), WAIT)

    sampler.poke()
    poked = await asyncio.wait_for(samples.get(), WAIT)

    assert poked.driver_version == "2"
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_poke_during_a_read_is_not_lost(nobody: ProcessAttributor) -> None:
    reader = GatedReader()
    sampler = Sampler(reader, nobody)
    samples: asyncio.Queue[HostObservation] = asyncio.Queue()
    task = asyncio.create_task(sampler.run(3600.0, samples.put_nowait))
    await reader.wait_entered()

    sampler.poke()
    reader.release()
    assert (await asyncio.wait_for(samples.get(), WAIT)).driver_version == "1"
    await reader.wait_entered()
    reader.release()

    assert (await asyncio.wait_for(samples.get(), WAIT)).driver_version == "2"
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_cancelling_run_mid_read_leaves_the_sampler_usable(
    nobody: ProcessAttributor,
) -> None:
    reader = GatedReader()
    sampler = Sampler(reader, nobody)
    delivered: list[object] = []
    task = asyncio.create_task(sampler.run(3600.0, delivered.append))
    await reader.wait_entered()

    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    sampler.poke()  # nobody is running: nothing happens
    reader.release()  # the read in the worker thread finishes on its own
    after = asyncio.create_task(sampler.sample())
    await reader.wait_entered()
    reader.release()

    assert (await after).driver_version == "2"
    assert delivered == []
    assert (reader.calls, reader.active) == (2, 0)


async def test_callback_error_is_reported_and_run_goes_on(nobody: ProcessAttributor) -> None:
    sampler = Sampler(InstantReader(), nobody)
    errors: list[Exception] = []
    later = asyncio.get_running_loop().create_future()

    def broken(sample: object) -> None:
        if not errors:
            raise LookupError("gate state is broken")
        if not later.done():
            later.set_result(sample)

    task = asyncio.create_task(sampler.run(0.01, broken, on_error=errors.append))
    try:
        await asyncio.wait_for(later, WAIT)
    finally:
        task.cancel()
    assert [str(e) for e in errors] == ["gate state is broken"]


@pytest.mark.parametrize("interval", [0.0, -1.0, float("nan")])
async def test_run_rejects_a_non_positive_interval(
    nobody: ProcessAttributor, interval: float
) -> None:
    with pytest.raises(ValueError, match="sample interval must be positive"):
        await Sampler(InstantReader(), nobody).run(interval, print)


@given(
    start=st.floats(0, 1e6),
    interval=st.floats(0.01, 60),
    late=st.floats(0, 1e4),
)
def test_next_tick_is_the_first_grid_point_after_now(
    start: float, interval: float, late: float
) -> None:
    now = start + late

    tick = next_tick(start, interval, now)

    steps = (tick - start) / interval
    assert tick > now - 1e-6
    assert tick - now <= interval + 1e-6
    assert abs(steps - round(steps)) < 1e-6 * max(1.0, steps)


@given(
    start=st.floats(0, 1e6),
    interval=st.floats(0.01, 60),
    late=st.floats(0, 1e4),
    window=st.floats(-10, 10),
)
def test_a_hurry_samples_every_hurry_every_until_it_ends_then_the_grid_again(
    start: float, interval: float, late: float, window: float
) -> None:
    now = start + late
    grid = next_tick(start, interval, now) - now

    until = now + window

    delay = next_delay(start, interval, now, until)

    if until <= now:
        assert delay == grid
    else:
        assert delay >= 0
        assert abs(delay - min(grid, HURRY_EVERY, window)) < 1e-6 * max(1.0, now)


async def test_hurry_samples_at_once_and_then_fast_though_the_interval_is_an_hour(
    nobody: ProcessAttributor,
) -> None:
    sampler = Sampler(InstantReader(), nobody)
    samples: asyncio.Queue[HostObservation] = asyncio.Queue()
    task = asyncio.create_task(sampler.run(3600.0, samples.put_nowait))
    await asyncio.wait_for(samples.get(), WAIT)

    sampler.hurry(60.0)
    # Four more within the wait: only a hurry makes a second one before the hour is out.
    drivers = [(await asyncio.wait_for(samples.get(), WAIT)).driver_version for _ in range(4)]

    assert drivers == ["2", "3", "4", "5"]
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_hurry_with_nobody_sampling_does_nothing(nobody: ProcessAttributor) -> None:
    reader = InstantReader()
    sampler = Sampler(reader, nobody)

    sampler.hurry(60.0)

    assert reader.calls == 0


# -- end to end over the fake NVML library ------------------------------------------------


def start_sleep(marker: str, spawned: list[subprocess.Popen[bytes]]) -> int:
    # Popen returns once exec has succeeded, so /proc already shows this argv.
    proc = subprocess.Popen([marker, "600"], executable="sleep", start_new_session=True)
    spawned.append(proc)
    return proc.pid


async def test_real_processes_end_to_end(
    sim_host: SimulatedGpuHost,
    fakenvml_loaded: ctypes.CDLL,
    spawned: list[subprocess.Popen[bytes]],
) -> None:
    tag = uuid.uuid4().hex[:10]
    ollama_pid = start_sleep(f"ollama-{tag}", spawned)
    comfy_pid = start_sleep(f"comfyui-{tag}", spawned)
    plex_pid = start_sleep(f"plex-{tag}", spawned)
    stray_pid = start_sleep(f"stray-{tag}", spawned)
    sim_host.allocate(ollama_pid, 7796 * MiB, name="ollama")
    sim_host.add_process(SimProcess(0, comfy_pid, 210 * MiB, "CG", "python3"))
    sim_host.allocate(plex_pid, 1536 * MiB, name="Plex Transcoder")
    sim_host.allocate(stray_pid, 300 * MiB)
    sim_host.set_base_used(0, 250 * MiB)
    config = Config(
        gate=GateSettings(proc_root=Path("/proc")),
        budget=BudgetSettings(),
        consumers=(
            consumer("ollama", ProcessMatch(commands=(f"ollama-{tag}",)), 11434),
            consumer("comfyui", ProcessMatch(commands=(f"comfyui-{tag}",)), 8188),
        ),
        external=(ExternalService("plex", ProcessMatch(commands=(f"plex-{tag}",))),),
    )
    sampler = Sampler.from_config(config)
    try:
        observation = await sampler.sample()
        os.killpg(plex_pid, signal.SIGKILL)
        spawned[2].wait()
        after_exit = await sampler.sample()
    finally:
        sampler.close()

    assert observation.error is None
    gpu = observation.device(0)
    assert gpu is not None
    assert gpu.managed == {"ollama": 7796 * MiB, "comfyui": 210 * MiB}
    assert gpu.external == {"plex": 1536 * MiB, OTHER: 300 * MiB, UNATTRIBUTED: 250 * MiB}
    assert gpu.unattributed == 250 * MiB
    by_pid = {p.pid: p for p in gpu.processes}
    assert by_pid[comfy_pid].kinds == "CG"
    assert by_pid[stray_pid].owner == Owner(OwnerKind.EXTERNAL, OTHER)
    assert {p.name for p in gpu.processes} == {"sleep"}
    assert gpu.free == 16 * GiB - 434 * MiB - (7796 + 210 + 1536 + 300 + 250) * MiB
    after = after_exit.device(0)
    assert after is not None
    assert "plex" not in after.external
    assert after.free - gpu.free == 1536 * MiB
    assert nvml.open_count() == 0


async def test_fake_tree_end_to_end_on_two_gpus(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fakenvml_loaded: ctypes.CDLL
) -> None:
    host = SimulatedGpuHost.create(
        tmp_path / "gpu",
        [
            SimDevice(0, 16 * GiB, 434 * MiB, "GPU-aaaa", "NVIDIA GeForce RTX 4080"),
            SimDevice(1, 24 * GiB, 300 * MiB, "GPU-bbbb", "NVIDIA GeForce RTX 3090", 64 * MiB),
        ],
        check_pids=False,
    )
    monkeypatch.setenv(STATE_ENV, str(host.state_path))
    tree = ProcTree(tmp_path / "proc")
    tree.add(
        812,
        comm="ollama",
        argv=["/usr/bin/ollama", "serve"],
        cgroup="0::/system.slice/ollama.service",
    )
    # A runner moved out of the unit's cgroup still belongs to its parent.
    tree.add(
        9001,
        ppid=812,
        comm="llama-server",
        argv=["/usr/lib/ollama/llama-server"],
        cgroup="0::/user.slice/user-1000.slice/session-2.scope",
    )
    tree.add(4100, comm="ffmpeg", cgroup="0::/system.slice/docker-3f4e2a9c.scope")
    tree.add(2210, comm="Xorg", argv=["/usr/lib/xorg/Xorg", ":0"])
    host.add_process(SimProcess(0, 9001, 7796 * MiB, "C", "llama-server"))
    host.add_process(SimProcess(1, 4100, 503 * MiB, "C", "ffmpeg"))
    host.add_process(SimProcess(0, 2210, -1, "G", "Xorg"))
    host.add_process(SimProcess(1, 7777, 360 * MiB, "C", "gone"))  # exited since NVML listed it
    attributor = ProcessAttributor(
        [consumer("ollama", ProcessMatch(units=("ollama.service",)), 11434)],
        [ExternalService("tdarr", ProcessMatch(units=("docker-3f4e2a9c.scope",)))],
        proc_root=tree.root,
    )
    sampler = Sampler(NvmlReader(), attributor)
    try:
        observation = await sampler.sample()
    finally:
        sampler.close()

    gpu0, gpu1 = observation.devices
    assert (gpu0.uuid, gpu1.uuid) == ("GPU-aaaa", "GPU-bbbb")
    assert gpu0.managed == {"ollama": 7796 * MiB}
    assert gpu0.external == {OTHER: 0}  # Xorg, whose bytes the driver cannot tell
    assert [p.used for p in gpu0.processes if p.pid == 2210] == [None]
    assert gpu1.managed == {}
    assert gpu1.external == {"tdarr": 503 * MiB, OTHER: 360 * MiB, UNATTRIBUTED: 64 * MiB}
    assert observation.driver_version == "550.54.15"


@pytest.mark.parametrize(
    ("code", "name"), [(9, "NVMLError_DriverNotLoaded"), (18, "NVMLError_LibRmVersionMismatch")]
)
async def test_init_error_end_to_end(
    sim_host: SimulatedGpuHost, fakenvml_loaded: ctypes.CDLL, code: int, name: str
) -> None:
    sim_host.set_init_error(code)
    sampler = Sampler(NvmlReader(), ProcessAttributor())
    try:
        failed = await sampler.sample()
        sim_host.clear_injections()
        recovered = await sampler.sample()
    finally:
        sampler.close()

    assert failed.devices == ()
    assert failed.error is not None
    assert (failed.error.code, failed.error.name, failed.error.call) == (
        code,
        name,
        "nvmlInitWithFlags",
    )
    assert recovered.error is None and len(recovered.devices) == 1
    assert nvml.open_count() == 0


async def test_gpu_lost_end_to_end(
    sim_host: SimulatedGpuHost, fakenvml_loaded: ctypes.CDLL
) -> None:
    sim_host.inject("nvmlDeviceGetMemoryInfo_v2", 15, gpu=0)
    sampler = Sampler(NvmlReader(), ProcessAttributor())
    try:
        observation = await sampler.sample()
    finally:
        sampler.close()

    assert observation.devices == ()
    assert observation.error == DriverFault(
        15, "NVMLError_GpuIsLost", "GPU 0: GPU is lost", "nvmlDeviceGetMemoryInfo_v2", 0
    )


async def test_process_list_fault_reaches_the_observation(
    sim_host: SimulatedGpuHost, fakenvml_loaded: ctypes.CDLL
) -> None:
    sim_host.inject("nvmlDeviceGetComputeRunningProcesses_v3", 4)
    sim_host.set_base_used(0, GiB)
    sampler = Sampler(NvmlReader(), ProcessAttributor())
    try:
        observation = await sampler.sample()
    finally:
        sampler.close()

    gpu = observation.device(0)
    assert gpu is not None and observation.error is None
    assert gpu.process_fault is not None
    assert (gpu.process_fault.name, gpu.process_fault.gpu) == ("NVMLError_NoPermission", 0)
    assert gpu.external == {UNATTRIBUTED: GiB}


async def test_nvml_read_runs_off_the_loop_thread(
    sim_host: SimulatedGpuHost, fakenvml_loaded: ctypes.CDLL
) -> None:
    threads: list[int] = []

    class RecordingReader(NvmlReader):
        def read(self) -> HostSample:
            threads.append(threading.get_ident())
            return super().read()

    class RecordingAttributor(ProcessAttributor):
        def attribute(self, pids: Collection[int]) -> dict[int, Attribution]:
            threads.append(threading.get_ident())
            return super().attribute(pids)

    sampler = Sampler(RecordingReader(), RecordingAttributor())
    try:
        observation = await sampler.sample()
    finally:
        sampler.close()

    assert observation.error is None
    assert len(threads) == 2
    assert threading.get_ident() not in threads


async def test_a_stalled_read_keeps_one_thread_and_leaves_the_loop_free(
    sim_host: SimulatedGpuHost, fakenvml_loaded: ctypes.CDLL
) -> None:
    in_flight, most = 0, 0
    counting = threading.Lock()

    class CountingReader(NvmlReader):
        def read(self) -> HostSample:
            nonlocal in_flight, most
            with counting:
                in_flight += 1
                most = max(most, in_flight)
            try:
                return super().read()
            finally:
                with counting:
                    in_flight -= 1

    sim_host.stall("nvmlDeviceGetMemoryInfo_v2", 400, gpu=0)
    loop = asyncio.get_running_loop()
    sampler = Sampler(CountingReader(), ProcessAttributor(), clock=loop.time)
    try:
        asked = loop.time()
        first = asyncio.ensure_future(sampler.sample())
        others = [asyncio.ensure_future(sampler.sample()) for _ in range(5)]
        ticks = 0
        while not first.done():
            await asyncio.sleep(0.01)  # the loop keeps turning while the driver hangs
            ticks += 1
        sim_host.clear_injections()
        observations = await asyncio.gather(first, *others)
    finally:
        sampler.close()

    assert ticks >= 10
    assert most == 1
    assert all(o.error is None for o in observations)
    # Stamped when the read began: the hung read's figures are as old as the hang.
    assert first.result().taken_at - asked < 0.05
    assert nvml.open_count() == 0


async def test_close_does_not_wait_for_a_hung_read(
    sim_host: SimulatedGpuHost, fakenvml_loaded: ctypes.CDLL
) -> None:
    # A hang long enough that no pause of a busy machine passes for waiting on it.
    sim_host.stall("nvmlDeviceGetMemoryInfo_v2", 2000, gpu=0)
    sampler = Sampler(NvmlReader(), ProcessAttributor())
    reading = asyncio.ensure_future(sampler.sample())
    while not sampler.reader.is_open:  # type: ignore[attr-defined]
        await asyncio.sleep(0.01)

    started = time.monotonic()
    sampler.close()
    closing_took = time.monotonic() - started
    observation = await reading

    assert closing_took < 1.0
    assert observation.error is None
    assert nvml.open_count() == 0
    assert (await sampler.sample()).error is not None  # closed for good
    assert nvml.open_count() == 0
