"""The shared device state of a simulated host: capacity, OOM events, reclaim, the file."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpugate.core.units import GiB, MiB
from gpugate_sim.device import (
    GpuOutOfMemory,
    HostState,
    SimDevice,
    SimFailure,
    SimProcess,
    SimulatedGpuHost,
)
from tests.sim.processes import LineReader, sleepers

CAPACITY = 16 * GiB - 434 * MiB
"""What the `sim_host` card can give to processes (total minus driver-reserved)."""


def test_allocations_fit_until_capacity(sim_host: SimulatedGpuHost) -> None:
    pid = os.getpid()
    assert sim_host.allocate(pid, 10 * GiB, name="ollama") == 10 * GiB
    assert sim_host.allocate(pid, GiB) == 11 * GiB, "a second allocation adds to the first"
    assert sim_host.free() == CAPACITY - 11 * GiB
    (row,) = sim_host.read().processes
    assert (row.pid, row.used, row.name, row.kind) == (pid, 11 * GiB, "ollama", "C")


def test_an_allocation_that_does_not_fit_fails_and_is_recorded(sim_host: SimulatedGpuHost) -> None:
    with sleepers(1) as (proc,):
        sim_host.allocate(proc.pid, 12 * GiB, name="gemma3")
        free = sim_host.free()
        with pytest.raises(GpuOutOfMemory) as caught:
            sim_host.allocate(os.getpid(), free + 1, name="whisper-server")
        assert (caught.value.gpu, caught.value.pid) == (0, os.getpid())
        assert (caught.value.requested, caught.value.free) == (free + 1, free)
        assert "out of memory" in str(caught.value)
        assert f"asked for {free + 1} bytes" in str(caught.value)
        # Nothing of the failed allocation is left behind.
        assert sim_host.free() == free
        assert [p.pid for p in sim_host.read().processes] == [proc.pid]
        (event,) = sim_host.ooms()
        assert (event.pid, event.name, event.requested, event.free) == (
            os.getpid(),
            "whisper-server",
            free + 1,
            free,
        )
        # Exactly what is free still fits.
        assert sim_host.allocate(os.getpid(), free) == free
        assert sim_host.free() == 0


def test_release_part_or_all(sim_host: SimulatedGpuHost) -> None:
    pid = os.getpid()
    sim_host.allocate(pid, 3 * GiB)
    assert sim_host.release(pid, GiB) == 2 * GiB
    assert sim_host.free() == CAPACITY - 2 * GiB
    assert sim_host.release(pid) == 0
    assert sim_host.read().processes == []
    assert sim_host.free() == CAPACITY
    assert sim_host.release(pid) == 0, "releasing nothing is not an error"


def test_release_more_than_held_drops_the_row(sim_host: SimulatedGpuHost) -> None:
    sim_host.allocate(os.getpid(), GiB)
    assert sim_host.release(os.getpid(), 2 * GiB) == 0
    assert sim_host.read().processes == []


def test_other_processes_keep_their_rows_on_release(sim_host: SimulatedGpuHost) -> None:
    with sleepers(1) as (other,):
        sim_host.allocate(other.pid, GiB, name="other")
        sim_host.allocate(os.getpid(), GiB, name="me")
        sim_host.release(os.getpid())
        assert [(p.pid, p.used) for p in sim_host.read().processes] == [(other.pid, GiB)]


def test_dead_pid_allocations_are_pruned(sim_host: SimulatedGpuHost) -> None:
    proc = subprocess.Popen(["sleep", "600"])
    try:
        sim_host.allocate(proc.pid, 5 * GiB, name="comfyui")
        assert sim_host.free() == CAPACITY - 5 * GiB
    finally:
        proc.kill()
        proc.wait(timeout=10)
    assert sim_host.read().processes == []
    assert sim_host.free() == CAPACITY
    # The next change rewrites the file without the dead process's row.
    sim_host.allocate(os.getpid(), GiB)
    assert f" {proc.pid} " not in sim_host.state_path.read_text()
    # And its memory is available again: a card-filling allocation fits.
    assert sim_host.allocate(os.getpid(), CAPACITY - GiB) == CAPACITY


def test_bad_requests_leave_the_state_alone(sim_host: SimulatedGpuHost) -> None:
    before = sim_host.state_path.read_text()
    with pytest.raises(ValueError, match="non-negative"):
        sim_host.allocate(os.getpid(), -1)
    with pytest.raises(KeyError, match="no simulated GPU 3"):
        sim_host.allocate(os.getpid(), GiB, gpu=3)
    with pytest.raises(ValueError, match="line break"):
        sim_host.allocate(os.getpid(), GiB, name="evil\nfail * nvmlInitWithFlags 9")
    with pytest.raises(KeyError, match="no simulated GPU 1"):
        sim_host.add_process(SimProcess(1, os.getpid(), GiB))
    assert sim_host.state_path.read_text() == before


WORKER = """
import os, sys
from gpugate_sim.device import GpuOutOfMemory, SimulatedGpuHost
host = SimulatedGpuHost(sys.argv[1])
chunk = int(sys.argv[2])
print("WAITING", flush=True)
sys.stdin.readline()
granted = refused = 0
for _ in range(int(sys.argv[3])):
    try:
        host.allocate(os.getpid(), chunk, name="worker")
        granted += 1
    except GpuOutOfMemory:
        refused += 1
print("DONE", granted, refused, flush=True)
sys.stdin.readline()
"""


def test_concurrent_allocators_never_exceed_capacity(sim_host: SimulatedGpuHost) -> None:
    chunk = 700 * MiB
    attempts = 8
    workers = [
        subprocess.Popen(
            [sys.executable, "-c", WORKER, str(sim_host.directory), str(chunk), str(attempts)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(4)
    ]
    try:
        readers = [LineReader(w.stdout) for w in workers]
        for reader in readers:
            assert reader.next() == "WAITING"
        for worker in workers:  # all start together, so they contend for the lock
            assert worker.stdin is not None
            worker.stdin.write("go\n")
            worker.stdin.flush()
        results = [reader.until("DONE").split()[1:] for reader in readers]
        granted = sum(int(g) for g, _ in results)
        refused = sum(int(r) for _, r in results)
        assert granted + refused == 4 * attempts
        assert granted == CAPACITY // chunk, "the card fills up exactly, never beyond"
        state = sim_host.read()
        assert state.used(0) == granted * chunk <= CAPACITY
        assert {p.pid: p.used for p in state.processes} == {
            w.pid: int(g) * chunk for w, (g, _) in zip(workers, results, strict=True) if int(g)
        }
        assert len(sim_host.ooms()) == refused
    finally:
        for worker in workers:
            if worker.stdin is not None:
                worker.stdin.close()
        for worker in workers:
            worker.wait(timeout=30)
    assert [w.returncode for w in workers] == [0, 0, 0, 0]
    assert sim_host.free() == CAPACITY, "the workers' memory came back when they exited"


# -- the file -------------------------------------------------------------------------------------


def test_render_and_parse_round_trip() -> None:
    state = HostState(
        devices=[
            SimDevice(
                0,
                16 * GiB,
                434 * MiB,
                "GPU-a",
                "NVIDIA GeForce RTX 4080",
                base_used=MiB,
                utilization=40,
                memory_utilization=7,
                power_mw=180_000,
            ),
            SimDevice(1, 24 * GiB, 0, "GPU-b", "NVIDIA GeForce RTX 3090 #2"),
        ],
        processes=[
            SimProcess(0, 4242, 2 * GiB, "C", "Plex Transcoder # hevc"),
            SimProcess(1, 1717, -1, "G", "Xorg"),
            SimProcess(1, 99, 5, "CG", ""),
        ],
        failures=[SimFailure("nvmlDeviceGetMemoryInfo_v2", 15, 0), SimFailure("nvmlShutdown", 3)],
        driver="535.183.01",
        cuda=12020,
        init_error=18,
        check_pids=False,
    )
    assert HostState.parse(state.render()) == state


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("gpu 0", "line 1: unknown directive 'gpu'"),
        ("device 0 1 0 0 GPU-a card\nproc 0 X 5 5 n", "line 2: kind must be C, G or CG"),
        ("proc 0 C 5 5 early", "line 1: no device 0 is declared above this line"),
        ("device 0 1 0 0 GPU-a a\ndevice 0 1 0 0 GPU-b b", "line 2: device 0 is declared twice"),
        ("device 1 1 0 0 GPU-a card", "device indexes must run 0, 1, 2"),
        ("device 0 lots 0 0 GPU-a card", "line 1: bad total 'lots'"),
        ("device 0 1 0 0 GPU-a card\nfail 0 nvmlShutdown 0", "line 2: 'code' must be >= 1"),
        ("check_pids 2", "line 1: check_pids '2' is above 1"),
        ("device 0 1 0 0 GPU-a " + "n" * 96, "line 1: device name is longer than 95 bytes"),
    ],
)
def test_parse_errors_name_the_line(text: str, message: str) -> None:
    with pytest.raises(ValueError, match="simulated GPU state") as caught:
        HostState.parse(text)
    assert message in str(caught.value)


def test_a_broken_state_file_is_reported_by_every_reader(tmp_path: Path) -> None:
    host = SimulatedGpuHost.create(tmp_path, [SimDevice(0, GiB, 0, "GPU-a", "card")])
    host.state_path.write_text("device 0 1 0 0 GPU-a card\nbogus\n")
    with pytest.raises(ValueError, match="line 2: unknown directive 'bogus'"):
        host.free()
    with pytest.raises(ValueError, match="line 2"):
        host.allocate(os.getpid(), 1)
