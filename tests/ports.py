"""Loopback ports for the servers a test starts, picked below the kernel's ephemeral range.

A port the kernel hands out for a bind to port 0 lies in the range it also takes the local
ports of outgoing connections from (`net.ipv4.ip_local_port_range`); between the pick and
the server's own bind, any connection the suite opens can take it, and the server's start
fails with "address in use". Ports below that range are never taken that way, so a port
picked there and found free stays free until the server binds it.
"""

from __future__ import annotations

import random
import socket
from collections import deque
from pathlib import Path

SPAN = 12_000
"""How many ports below the ephemeral range are picked from."""
RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
_handed: deque[int] = deque(maxlen=SPAN // 4)
"""Recently handed ports: a server may not have bound its port yet."""


def ephemeral_low(path: Path = RANGE_FILE) -> int:
    """The lowest port the kernel picks for outgoing connections (32768 where unknown)."""
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _bindable(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_ports(count: int) -> list[int]:
    """Distinct loopback ports nothing holds now, below the ephemeral range."""
    high = ephemeral_low()
    low = max(1024, high - SPAN)
    picked: list[int] = []
    for _ in range(count * 200):
        if len(picked) == count:
            return picked
        port = random.randrange(low, high)
        if port in picked or port in _handed or not _bindable(port):
            continue
        picked.append(port)
        _handed.append(port)
    if len(picked) == count:
        return picked
    raise RuntimeError(f"no {count} free ports between {low} and {high}")


def free_port() -> int:
    """One loopback port nothing holds now, below the ephemeral range."""
    return free_ports(1)[0]
