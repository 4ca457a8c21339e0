"""`gpugate serve` with a database it cannot open: it starts, serves, and stops in time."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import time

import pytest

from tests.faults.stack import post, stack

pytestmark = pytest.mark.e2e

GRACE = 2.0
"""`shutdown_grace` of the stack's configuration."""
EXIT_BOUND = GRACE + 1.0 + 1.5
"""The grace, about a second to close, and slack for a loaded test host."""


async def test_an_unopenable_database_is_one_log_line_and_a_degraded_start(tmp_path):
    # A directory where the file should be: SQLite cannot open it, even as root.
    # In front of a simulated host the store is `gpugate.db` beside its state.
    database = tmp_path / "state" / "gpugate.db"
    database.mkdir(parents=True)
    async with stack(tmp_path, gate={"database": tmp_path / "gate.db"}) as s:
        status, _, body = await post(
            s.url + "/api/generate", {"model": "llama3.2:3b", "prompt": "x", "stream": False}
        )
        assert status == 200, body
        metrics = await s.gate.metrics()
        assert "gpugate_store_up 0.0" in metrics
        health = await s.gate.get_json("/gate/v1/health")
        assert "store" in health["failed"]
        lines = s.gate.stderr_lines()
        opened = [line for line in lines if "store: cannot open" in line]
        assert len(opened) == 1 and str(database) in opened[0], lines
        assert not any("Traceback" in line for line in lines), lines

        s.gate.signal(signal.SIGTERM)
        started = time.monotonic()
        try:
            code = await asyncio.to_thread(s.gate.process.wait, EXIT_BOUND)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the gate did not exit within {EXIT_BOUND}s of SIGTERM")
        assert code == 0 and time.monotonic() - started < EXIT_BOUND
