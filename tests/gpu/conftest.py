from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Iterator

import pytest

from gpugate_sim.device import pid_alive


@pytest.fixture
def spawned() -> Iterator[list[subprocess.Popen[bytes]]]:
    """Real processes started by a test, each in its own group, killed afterwards."""
    procs: list[subprocess.Popen[bytes]] = []
    yield procs
    for proc in procs:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert not any(pid_alive(p.pid) for p in procs)
