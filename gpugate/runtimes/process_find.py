"""Finding a runtime's process that is already there, before starting another.

A process the gate started outlives the gate (a real child is not killed with its parent),
and a runtime can be started by hand or by its unit behind the gate's back. whisper-server
and llama-server bind with SO_REUSEPORT, so a second instance starts and binds the same
port without an error: on a full card that second start is the crash the gate exists to
prevent. Before it starts a process the gate therefore looks for one:

* by its port: the processes with a listening socket on the upstream's port (the socket's
  inode in /proc/net/tcp{,6}, then the process whose /proc/PID/fd holds it);
* by its command line: a process whose /proc/PID/cmdline is the command the gate runs
  (it may still be loading its model, before it binds).

What cannot be read (another user's /proc/PID/fd without privileges) is not found; the
port's own answer then still says something is there.

`watch_exit(pid)` resolves when a process that is not the gate's child ends (a pidfd), and
`stop_pid(pid)` ends one (SIGTERM, then SIGKILL).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import Sequence
from pathlib import Path

PROC = Path("/proc")
LISTEN = "0A"
"""The state column of a listening socket in /proc/net/tcp."""


def listening_inodes(port: int, proc: Path = PROC) -> set[str]:
    """Inodes of the sockets listening on `port` (IPv4 and IPv6, any address)."""
    found: set[str] = set()
    for table in ("tcp", "tcp6"):
        try:
            lines = (proc / "net" / table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) < 10 or fields[3] != LISTEN:
                continue
            _, _, hex_port = fields[1].rpartition(":")
            with contextlib.suppress(ValueError):
                if int(hex_port, 16) == port:
                    found.add(fields[9])
    return found


def _pids(proc: Path) -> list[int]:
    try:
        return sorted(int(p.name) for p in proc.iterdir() if p.name.isdigit())
    except OSError:
        return []


def listening_pids(port: int, proc: Path = PROC) -> list[int]:
    """The processes holding a socket that listens on `port`, lowest PID first."""
    wanted = {f"socket:[{inode}]" for inode in listening_inodes(port, proc)}
    if not wanted:
        return []
    found = []
    for pid in _pids(proc):
        fds = proc / str(pid) / "fd"
        try:
            names = os.listdir(fds)
        except OSError:
            continue
        for name in names:
            try:
                if os.readlink(fds / name) in wanted:
                    found.append(pid)
                    break
            except OSError:
                continue
    return found


def command_pids(argv: Sequence[str], proc: Path = PROC, *, told: bool = False) -> list[int]:
    """The processes whose command line is exactly `argv`, lowest PID first; `told`: or
    `argv` and one numeric option after it, the cap a start added (`-c 4096`)."""
    wanted = b"\0".join(a.encode() for a in argv) + b"\0"
    found = []
    for pid in _pids(proc):
        try:
            line = (proc / str(pid) / "cmdline").read_bytes()
        except OSError:
            continue
        if line == wanted or (told and line.startswith(wanted) and _a_cap(line[len(wanted) :])):
            found.append(pid)
    return found


def _a_cap(rest: bytes) -> bool:
    """Whether `rest` (NUL-ended words) is one option and a number: `-c\04096\0`."""
    words = rest.split(b"\0")
    if len(words) != 3 or words[2] != b"" or not words[0].startswith(b"-"):
        return False
    try:
        float(words[1])
    except ValueError:
        return False
    return True


def alive(pid: int) -> bool:
    """Whether `pid` is a process that has not ended (a zombie has)."""
    try:
        stat = (PROC / str(pid) / "stat").read_text()
    except OSError:
        return False
    # The state follows the command name, which is in parentheses and may hold spaces.
    return stat.rpartition(")")[2].split()[:1] != ["Z"]


async def watch_exit(pid: int, interval: float = 0.5) -> None:
    """Return when `pid` has ended: at once through a pidfd, else by polling /proc."""
    loop = asyncio.get_running_loop()
    try:
        fd = os.pidfd_open(pid)
    except (OSError, AttributeError):
        while alive(pid):
            await asyncio.sleep(interval)
        return
    ended = loop.create_future()
    try:
        loop.add_reader(fd, lambda: ended.done() or ended.set_result(None))
        try:
            await ended
        finally:
            loop.remove_reader(fd)
    finally:
        os.close(fd)


async def stop_pid(pid: int, grace: float) -> None:
    """SIGTERM a process that is not the gate's child, SIGKILL after `grace`, and wait."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, signal.SIGTERM)
    try:
        async with asyncio.timeout(grace):
            await watch_exit(pid, interval=0.1)
            return
    except TimeoutError:
        pass
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(grace):
            await watch_exit(pid, interval=0.1)
