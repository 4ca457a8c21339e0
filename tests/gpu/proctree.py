"""A fake proc tree: `<root>/<pid>/{stat,status,comm,cmdline,cgroup}` as Linux writes them."""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from pathlib import Path

import attrs

PROC_FILES = ("stat", "status", "comm", "cmdline", "cgroup")


@attrs.frozen
class FakeProcess:
    pid: int
    ppid: int = 1
    comm: str = "proc"
    argv: tuple[str, ...] = ()
    cgroup: str = "0::/user.slice/user-1000.slice/session-2.scope"
    start_time: int = 1000
    nspid: tuple[int, ...] = ()


class ProcTree:
    """Writes processes the way the kernel presents them, so parsing is tested for real."""

    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)

    def add(
        self,
        pid: int,
        *,
        ppid: int = 1,
        comm: str = "proc",
        argv: Sequence[str] = (),
        cgroup: str = "0::/user.slice/user-1000.slice/session-2.scope",
        start_time: int = 1000,
        nspid: Sequence[int] = (),
        unreadable: Sequence[str] = (),
    ) -> FakeProcess:
        """Create (or replace) a process; `unreadable` names files that fail to read."""
        process = FakeProcess(pid, ppid, comm, tuple(argv), cgroup, start_time, tuple(nspid))
        directory = self.root / str(pid)
        if directory.exists():
            shutil.rmtree(directory)
        directory.mkdir()
        contents = {
            "stat": _stat_line(process),
            "status": _status(process),
            # The kernel cuts the name to 15 characters.
            "comm": process.comm[:15] + "\n",
            "cmdline": "".join(a + "\0" for a in process.argv),
            "cgroup": process.cgroup if process.cgroup.endswith("\n") else process.cgroup + "\n",
        }
        for name, text in contents.items():
            if name in unreadable:
                # Root reads through mode 000, so a file that cannot be read is modelled as
                # an entry that open() refuses for every user: a directory.
                (directory / name).mkdir()
            else:
                (directory / name).write_text(text)
        return process

    def remove(self, pid: int) -> None:
        """The process exits: its directory vanishes."""
        shutil.rmtree(self.root / str(pid))


def _stat_line(p: FakeProcess) -> str:
    # pid (comm) state ppid pgrp session tty_nr tpgid flags minflt cminflt majflt cmajflt
    # utime stime cutime cstime priority nice num_threads itrealvalue starttime vsize ...
    rest = [p.ppid, p.pid, p.pid, 0, -1, 4194560, 0, 0, 0, 0, 1, 1, 0, 0, 20, 0, 1, 0]
    tail = [p.start_time, 123456789, 1024]
    return f"{p.pid} ({p.comm[:15]}) S {' '.join(map(str, rest))} {' '.join(map(str, tail))}\n"


def _status(p: FakeProcess) -> str:
    nspid = " ".join(str(n) for n in (p.nspid or (p.pid,)))
    return (
        f"Name:\t{p.comm[:15]}\n"
        "State:\tS (sleeping)\n"
        f"Tgid:\t{p.pid}\n"
        f"Pid:\t{p.pid}\n"
        f"PPid:\t{p.ppid}\n"
        f"NSpid:\t{nspid}\n"
    )
