"""Fixtures shared by the whole suite: the fake NVML library and simulated GPU hosts."""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

import pytest

from gpugate.core.units import GiB, MiB
from gpugate_sim.device import SimDevice, SimulatedGpuHost
from gpugate_sim.shim import STATE_ENV, library_path

CARD_UUID = "GPU-5f0e3a41-9b1c-4d2e-8f37-6a2b1c0d9e84"


@pytest.fixture(scope="session")
def fakenvml_path() -> Path:
    """The compiled fake libnvidia-ml.so.1 (built on first use)."""
    return library_path()


@pytest.fixture(scope="session")
def fakenvml_loaded(fakenvml_path: Path) -> ctypes.CDLL:
    """The fake library loaded into this process before pynvml's first dlopen.

    Its SONAME is libnvidia-ml.so.1, so pynvml's later dlopen gets this same handle.
    """
    return ctypes.CDLL(str(fakenvml_path))


@pytest.fixture
def sim_host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> SimulatedGpuHost:
    """A 16 GiB card with 434 MiB driver-reserved and no processes; the fake library reads it."""
    host = SimulatedGpuHost.create(
        tmp_path / "gpu",
        [SimDevice(0, 16 * GiB, 434 * MiB, CARD_UUID, "NVIDIA GeForce RTX 4080")],
    )
    monkeypatch.setenv(STATE_ENV, str(host.state_path))
    return host


@pytest.fixture
def subprocess_env(fakenvml_path: Path, sim_host: SimulatedGpuHost) -> dict[str, str]:
    """Environment for a gpugate subprocess that must see `sim_host` through the fake library."""
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = str(fakenvml_path.parent)
    env[STATE_ENV] = str(sim_host.state_path)
    return env
