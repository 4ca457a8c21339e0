"""The two servers of the Go dialect's differential tests, started once per module."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpugate.proxy.dialects.go import DIALECT
from tests.dialects.wire import serve_echo
from tests.sim.processes import LineReader

ROOT = Path(__file__).resolve().parents[2]
ECHO_BINARY = ROOT / "build" / "nethttp" / "nethttp-echo"


@pytest.fixture(scope="module")
def oracle() -> Iterator[tuple[str, int]]:
    """The Go net/http echo server's address."""
    process = subprocess.Popen(
        [str(ECHO_BINARY), "-listen", "127.0.0.1:0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        host, _, port = LineReader(process.stdout).until("READY ").split()[1].rpartition(":")
        yield host, int(port)
    finally:
        process.terminate()
        process.wait(timeout=30)


@pytest.fixture(scope="module")
def subject() -> Iterator[tuple[str, int]]:
    """The echo handler behind the Go dialect."""
    with serve_echo(DIALECT) as address:
        yield address
