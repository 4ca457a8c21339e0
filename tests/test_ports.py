"""The suite's port picks: free, distinct, and never where outgoing connections take theirs."""

from __future__ import annotations

import random
import socket
from pathlib import Path

from tests.ports import ephemeral_low, free_ports


def test_ports_are_free_distinct_and_below_the_ephemeral_range():
    ports = free_ports(50)
    assert len(set(ports)) == 50
    assert all(1024 <= port < ephemeral_low() for port in ports)
    for port in ports[:5]:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))
    assert not set(ports) & set(free_ports(50)), "a port handed out twice"


def test_a_held_port_is_not_handed_out(monkeypatch):
    held = socket.socket()
    held.bind(("127.0.0.1", 0))
    port = held.getsockname()[1]
    first = [port, port]
    real = random.randrange
    monkeypatch.setattr(
        "tests.ports.random.randrange",
        lambda low, high: first.pop() if first else real(low, high),
    )
    monkeypatch.setattr("tests.ports.ephemeral_low", lambda: 65536)
    try:
        assert free_ports(1) != [port]
        assert not first, "the held port was tried"
    finally:
        held.close()


def test_the_range_is_read_from_the_kernel(tmp_path: Path):
    path = tmp_path / "range"
    path.write_text("40000\t60999\n")
    assert ephemeral_low(path) == 40000
    assert ephemeral_low(tmp_path / "missing") == 32768
