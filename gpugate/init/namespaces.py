"""Whether a process shares init's own network and PID namespaces.

The gate runs where init runs. A process in another network namespace (a container's, a
unit's `PrivateNetwork=`, an `unshare -n`) listens on that namespace's addresses: its
loopback is not this one's, /proc/net/tcp here does not list its sockets, and moving it to
127.0.0.1 would cut off every client that reaches it now. A process in another PID
namespace is a container's, not started or stopped by this host's commands. Init
therefore proposes only what shares both of its namespaces, or what the operator names
(`--pid`).

How it tells, as namespaces(7) says: two processes are in the same namespace when the
device and inode numbers of their /proc/PID/ns/TYPE links are the same. Following the
link needs ptrace read access to the process (root, or its own user). Without it:

* network: every network namespace has its own /proc/net tables, each its own proc entry,
  so /proc/PID/net/tcp stats to its namespace's inode (readable by every user);
* PID: /proc/PID/status's `NSpid:` lists the process's PID in each namespace from the
  one /proc was mounted for down to its own: where init's own line has one entry (its
  /proc is its namespace's), a process with one entry shares it and one with more is in
  a namespace below it.

What neither way tells is `UNKNOWN`, and an unknown process is not proposed either.
"""

from __future__ import annotations

import enum
import os
from pathlib import Path

import attrs

SELF = Path("/proc/self")


class Sharing(enum.Enum):
    """Whether a process is in init's own namespace of one type."""

    SAME = "same"
    OTHER = "other"
    UNKNOWN = "unknown"


@attrs.frozen
class Namespaces:
    """Where a process runs, against init's own namespaces."""

    net: Sharing = Sharing.SAME
    pid: Sharing = Sharing.SAME
    net_id: str = ""
    """Its network namespace as /proc shows it (`net:[4026532175]`), where readable."""
    pid_id: str = ""

    @property
    def here(self) -> bool:
        """In init's network and PID namespaces both: a candidate to front."""
        return self.net is Sharing.SAME and self.pid is Sharing.SAME

    @property
    def same_net(self) -> bool:
        return self.net is Sharing.SAME

    def elsewhere(self, own: Namespaces) -> str:
        """Where it runs instead, in words (`""` when here)."""
        if self.net is Sharing.OTHER:
            return "in another network namespace" + _ids(self.net_id, own.net_id)
        if self.pid is Sharing.OTHER:
            return "in another PID namespace" + _ids(self.pid_id, own.pid_id)
        if self.net is Sharing.UNKNOWN:
            return "in a network namespace init could not read"
        if self.pid is Sharing.UNKNOWN:
            return "in a PID namespace init could not read"
        return ""


HERE = Namespaces()


def _ids(theirs: str, ours: str) -> str:
    if theirs and ours:
        return f" ({theirs}; init's is {ours})"
    return f" ({theirs})" if theirs else ""


def _stat(path: Path) -> tuple[int, int] | None:
    try:
        found = os.stat(path)
    except OSError:
        return None
    return found.st_dev, found.st_ino


def _link(path: Path) -> str:
    try:
        return os.readlink(path)
    except OSError:
        return ""


def _nspid_depth(base: Path) -> int | None:
    """How many entries the `NSpid:` line of `base/status` has (None: unreadable)."""
    try:
        text = (base / "status").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("NSpid:"):
            return len(line.split()) - 1 or None
    return None


@attrs.frozen
class OwnNamespaces:
    """Init's own namespaces, each read every way a process's may be compared with them."""

    net: tuple[int, int] | None
    pid: tuple[int, int] | None
    net_table: tuple[int, int] | None
    """The (device, inode) of its /proc/net/tcp."""
    nspid_depth: int | None
    shown: Namespaces

    @classmethod
    def read(cls, self_dir: Path = SELF) -> OwnNamespaces:
        """This process's, from /proc/self."""
        return cls(
            net=_stat(self_dir / "ns" / "net"),
            pid=_stat(self_dir / "ns" / "pid"),
            net_table=_stat(self_dir / "net" / "tcp"),
            nspid_depth=_nspid_depth(self_dir),
            shown=Namespaces(
                net_id=_link(self_dir / "ns" / "net"), pid_id=_link(self_dir / "ns" / "pid")
            ),
        )

    def of(self, base: Path) -> Namespaces:
        """The namespaces of the process whose /proc directory is `base`."""
        return Namespaces(
            net=self._net(base),
            pid=self._pid(base),
            net_id=_link(base / "ns" / "net"),
            pid_id=_link(base / "ns" / "pid"),
        )

    def _net(self, base: Path) -> Sharing:
        theirs = _stat(base / "ns" / "net")
        if theirs is not None and self.net is not None:
            return Sharing.SAME if theirs == self.net else Sharing.OTHER
        table = _stat(base / "net" / "tcp")
        if table is not None and self.net_table is not None:
            return Sharing.SAME if table == self.net_table else Sharing.OTHER
        return Sharing.UNKNOWN

    def _pid(self, base: Path) -> Sharing:
        theirs = _stat(base / "ns" / "pid")
        if theirs is not None and self.pid is not None:
            return Sharing.SAME if theirs == self.pid else Sharing.OTHER
        depth = _nspid_depth(base)
        if depth is None or self.nspid_depth != 1:
            return Sharing.UNKNOWN
        return Sharing.SAME if depth == 1 else Sharing.OTHER
