"""Which watched processes have exited, from one epoll wait over a pidfd per process.

A pidfd (`pidfd_open(2)`, Linux 5.3) refers to one process, not to its PID number: it
becomes readable once that process has exited (as a zombie already), and a PID the kernel
later gives to another process does not make it refer to the newcomer. So as long as a
pidfd opened *before* a PID's /proc entry was read is not readable, that entry was the
process's, and so is anything learnt from it. The attributor relies on this to trust
what it read about a PID without reading /proc again. The pidfds sit in an epoll set,
so asking costs one `epoll_wait` that returns only the processes that exited: `poll()`
would have the kernel look at every pidfd, each sample.

Descriptors are a shared budget: the listeners size their connection caps from the
open-files limit. The watch holds at most MAX_WATCHED pidfds and at most one in
LIMIT_SHARE of the soft limit, and opens none when the descriptor it was given shows the
table filling up (the kernel hands out the lowest free number, so descriptor N means N
are in use). A PID it does not watch is simply read from /proc as before.
"""

from __future__ import annotations

import contextlib
import errno
import os
import resource
import select
import weakref
from collections.abc import Callable, Collection

MAX_WATCHED = 1024
"""At most this many pidfds at once, whatever the limit."""
LIMIT_SHARE = 16
"""At most one pidfd per this many descriptors of the soft RLIMIT_NOFILE."""
FULL_SHARE = 4
"""No pidfd is kept once descriptor numbers reach the last 1/FULL_SHARE of the limit."""

_UNSUPPORTED = frozenset({errno.ENOSYS, errno.EPERM, errno.ENODEV})
"""pidfd_open failures that say pidfds cannot be had here at all (an old kernel, a
seccomp filter), as opposed to for one PID."""


def pidfds_available() -> bool:
    """Whether this Python offers pidfd_open and epoll (the kernel may still refuse)."""
    return hasattr(os, "pidfd_open") and hasattr(select, "epoll")


def same_pid_namespace(proc_root: str) -> bool:
    """Whether `proc_root` is a proc mount of this process's PID namespace.

    pidfd_open takes PIDs of our namespace; NVML's, read against a host's /proc mounted
    elsewhere, may be another's. A mount of our namespace names this process as `self`.
    """
    try:
        return os.readlink(os.path.join(proc_root, "self")) == str(os.getpid())
    except OSError:
        return False


def _close_all(fds: dict[int, int], epoll: select.epoll) -> None:
    for fd in fds.values():
        with contextlib.suppress(OSError):
            os.close(fd)
    fds.clear()
    epoll.close()


class ExitWatch:
    """A pidfd per watched PID, and which of them fired; not thread-safe (the attributor
    calls it under its lock)."""

    def __init__(
        self,
        *,
        max_watched: int = MAX_WATCHED,
        open_pidfd: Callable[[int], int] | None = None,
        fd_limit: Callable[[], int] | None = None,
    ) -> None:
        self.max_watched = max_watched
        self._open_pidfd = open_pidfd or os.pidfd_open
        self._fd_limit = fd_limit or _soft_fd_limit
        self._fds: dict[int, int] = {}
        """PID → its pidfd."""
        self._pids: dict[int, int] = {}
        """pidfd → its PID."""
        self._epoll = select.epoll()
        self._limit = self._fd_limit()
        self.enabled = True
        """False once the kernel refused pidfds outright; nothing is watched after that."""
        # Attributors are dropped without close() (tests, reloads): their descriptors
        # must not outlive them.
        self._finalizer = weakref.finalize(self, _close_all, self._fds, self._epoll)

    def __len__(self) -> int:
        return len(self._fds)

    def __contains__(self, pid: object) -> bool:
        return pid in self._fds

    @property
    def capacity(self) -> int:
        """How many pidfds may be held, from the bound and the open-files limit."""
        return min(self.max_watched, self._limit // LIMIT_SHARE)

    def watch(self, pid: int) -> bool:
        """Open a pidfd for `pid` (before its /proc entry is read); False when it is not
        watched: gone, refused, or no room."""
        if pid in self._fds:
            return True
        if not self.enabled or len(self._fds) >= self.capacity:
            return False
        try:
            fd = self._open_pidfd(pid)
        except OSError as exc:
            if exc.errno in _UNSUPPORTED:
                self.enabled = False
            # ESRCH: gone already; EINVAL: not a process's leader; EMFILE: no room now.
            return False
        except (ValueError, OverflowError):  # no PID this kernel could have
            return False
        if fd >= self._limit * (FULL_SHARE - 1) // FULL_SHARE:
            os.close(fd)
            return False
        try:
            self._epoll.register(fd, select.EPOLLIN)
        except OSError:  # the user's epoll watches are used up: read /proc instead
            os.close(fd)
            return False
        self._fds[pid] = fd
        self._pids[fd] = pid
        return True

    def exited(self) -> list[int]:
        """The watched PIDs whose process has exited since they were watched (and any a
        lowered limit leaves no room for); they are no longer watched. Called once per
        sample, before `watch`: it also reads the open-files limit again, which the gate
        raises once it has started."""
        self._limit = self._fd_limit()
        if not self._fds:
            return []
        # Level-triggered: a pidfd that fired stays ready until it is forgotten below.
        gone = [self._pids[fd] for fd, _ in self._epoll.poll(0) if fd in self._pids]
        # A lowered limit takes back what no longer fits; those PIDs are read from /proc.
        gone = list(dict.fromkeys(gone + list(self._fds)[self.capacity :]))
        for pid in gone:
            self.forget(pid)
        return gone

    def forget(self, pid: int) -> None:
        """Stop watching `pid` (nothing when it is not watched)."""
        fd = self._fds.pop(pid, None)
        if fd is None:
            return
        del self._pids[fd]
        self._epoll.unregister(fd)
        with contextlib.suppress(OSError):
            os.close(fd)

    def keep_only(self, pids: Collection[int]) -> None:
        """Stop watching every PID not in `pids`."""
        for pid in [p for p in self._fds if p not in pids]:
            self.forget(pid)

    def close(self) -> None:
        """Close every pidfd and the epoll set; nothing is watched after."""
        self._finalizer()
        self._pids.clear()
        self.enabled = False


def _soft_fd_limit() -> int:
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    # An unlimited table is bounded by MAX_WATCHED alone.
    return soft if soft != resource.RLIM_INFINITY else MAX_WATCHED * LIMIT_SHARE
