"""An idle host's samples: the last observation of a GPU stands while nothing changed, and
its sums by owner are computed once and shared read-only."""

from __future__ import annotations

import ctypes
from pathlib import Path

import pytest

from gpugate.config.model import ExternalService, ProcessMatch
from gpugate.core.observation import (
    OTHER,
    UNATTRIBUTED,
    GpuObservation,
    Owner,
    OwnerKind,
    ProcessUsage,
)
from gpugate.core.units import GiB, MiB
from gpugate.gpu.attribution import ProcessAttributor
from gpugate.gpu.nvml import NvmlReader
from gpugate.gpu.sampler import Sampler
from gpugate_sim.device import SimDevice, SimProcess, SimulatedGpuHost
from gpugate_sim.shim import STATE_ENV
from tests.gpu.proctree import ProcTree
from tests.gpu.support import consumer

OLLAMA = Owner(OwnerKind.CONSUMER, "ollama")


@pytest.fixture
def host(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fakenvml_loaded: ctypes.CDLL
) -> SimulatedGpuHost:
    host = SimulatedGpuHost.create(
        tmp_path / "gpu",
        [
            SimDevice(0, 16 * GiB, 434 * MiB, "GPU-aaaa", "NVIDIA GeForce RTX 4080", 64 * MiB),
            SimDevice(1, 24 * GiB, 300 * MiB, "GPU-bbbb", "NVIDIA GeForce RTX 3090"),
        ],
        check_pids=False,
    )
    monkeypatch.setenv(STATE_ENV, str(host.state_path))
    return host


@pytest.fixture
def tree(tmp_path: Path) -> ProcTree:
    tree = ProcTree(tmp_path / "proc")
    tree.add(812, comm="ollama", cgroup="0::/system.slice/ollama.service")
    tree.add(3001, comm="Plex Transcoder")
    return tree


@pytest.fixture
def sampler(host: SimulatedGpuHost, tree: ProcTree) -> Sampler:
    attributor = ProcessAttributor(
        [consumer("ollama", ProcessMatch(units=("ollama.service",)))],
        [ExternalService("plex", ProcessMatch(names=("Plex Transcoder",)))],
        proc_root=tree.root,
    )
    return Sampler(NvmlReader(), attributor)


def test_an_unchanged_gpu_is_the_same_observation(host: SimulatedGpuHost, sampler: Sampler) -> None:
    host.add_process(SimProcess(0, 812, 4 * GiB, "C", "ollama"))
    host.add_process(SimProcess(1, 3001, GiB, "C", "Plex Transcoder"))
    try:
        first = sampler.sample_blocking()
        again = sampler.sample_blocking()
        host.add_process(SimProcess(1, 3001, GiB, "G", "Plex Transcoder"))
        graphics_too = sampler.sample_blocking()
    finally:
        sampler.close()

    assert again is not first
    assert again.devices[0] is first.devices[0]
    assert again.devices[1] is first.devices[1]
    assert again.devices[0].managed == {"ollama": 4 * GiB}
    assert again.devices[0].external == {UNATTRIBUTED: 64 * MiB}
    # A change on one GPU is observed afresh there, and only there.
    assert graphics_too.devices[0] is first.devices[0]
    gpu1 = graphics_too.devices[1]
    assert gpu1 is not first.devices[1]
    assert [p.kinds for p in gpu1.processes] == ["CG"]
    assert gpu1.external["plex"] == GiB


def test_a_changed_owner_is_observed_afresh(
    host: SimulatedGpuHost, tree: ProcTree, sampler: Sampler
) -> None:
    host.add_process(SimProcess(0, 812, 4 * GiB, "C", "ollama"))
    try:
        first = sampler.sample_blocking()
        # The same PID, now another process (a new start time), on an unchanged card.
        tree.add(812, comm="Plex Transcoder", start_time=9000)
        after = sampler.sample_blocking()
    finally:
        sampler.close()

    assert after.devices[0] is not first.devices[0]
    assert after.devices[0].managed == {}
    assert after.devices[0].external == {"plex": 4 * GiB, UNATTRIBUTED: 64 * MiB}


def test_sums_by_owner_are_computed_once_and_read_only() -> None:
    processes = (
        ProcessUsage(1, 3 * GiB, OLLAMA),
        ProcessUsage(2, None, Owner(OwnerKind.EXTERNAL, OTHER), kinds="G"),
        ProcessUsage(3, GiB, OLLAMA),
        ProcessUsage(4, 2 * GiB, Owner(OwnerKind.EXTERNAL, "plex")),
    )
    gpu = GpuObservation(0, "GPU-0", "card", 24 * GiB, 0, 7 * GiB, 17 * GiB, processes)

    assert gpu.managed == {"ollama": 4 * GiB}
    assert gpu.external == {OTHER: 0, "plex": 2 * GiB, UNATTRIBUTED: GiB}
    assert gpu.unattributed == GiB
    assert gpu.managed is gpu.managed
    assert gpu.external is gpu.external
    with pytest.raises(TypeError):
        gpu.external["plex"] = 0  # type: ignore[index]
    # The sums are no field: equality and hashing are the observation's figures alone.
    twin = GpuObservation(0, "GPU-0", "card", 24 * GiB, 0, 7 * GiB, 17 * GiB, processes)
    assert gpu == twin and hash(gpu) == hash(twin)


def test_sums_of_an_observation_without_processes() -> None:
    gpu = GpuObservation(0, "GPU-0", "card", 24 * GiB, 0, 0, 24 * GiB)

    assert (dict(gpu.managed), dict(gpu.external), gpu.unattributed) == ({}, {}, 0)
