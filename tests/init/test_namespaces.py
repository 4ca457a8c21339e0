"""Telling init's own namespaces from another's: by the /proc/PID/ns links, and, where those
cannot be followed (another user's process, without root), by the process's /proc/net
tables and its NSpid line. Real processes in real namespaces (`unshare`, with a user
namespace: no privilege needed)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

from gpugate.init.namespaces import HERE, Namespaces, OwnNamespaces, Sharing
from tests.init.simhost import descendants
from tests.sim.processes import LineReader


@contextlib.contextmanager
def unshared(*flags: str) -> Iterator[int]:
    """A process in namespaces of its own (`unshare FLAGS`), once it runs there: its PID as
    this namespace sees it."""
    popen = subprocess.Popen(
        ["unshare", "--user", "--map-root-user", *flags,
         "/bin/sh", "-c", "echo ready; exec sleep 600"],
        stdout=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    try:
        assert popen.stdout is not None
        assert LineReader(popen.stdout).next(timeout=30) == "ready"
        # With --fork the shell is unshare's child; without, unshare became it.
        (pid,) = [p for p in descendants([popen.pid]) if p != popen.pid] or [popen.pid]
        yield pid
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(popen.pid, signal.SIGKILL)
        popen.wait(timeout=30)


def without_ns_links(directory: Path, source: str) -> Path:
    """A process directory as another user sees it without root: its net tables and status
    readable, its ns links not."""
    directory.mkdir()
    (directory / "net").symlink_to(f"{source}/net")
    (directory / "status").symlink_to(f"{source}/status")
    return directory


def test_init_s_own_process_is_here_every_way(tmp_path: Path) -> None:
    own = OwnNamespaces.read()
    assert own.of(Path("/proc/self")).here
    assert own.of(without_ns_links(tmp_path / "self", "/proc/self")).here
    assert own.shown.net_id == os.readlink("/proc/self/ns/net")


def test_a_process_in_another_network_namespace_is_told_apart_every_way(tmp_path: Path) -> None:
    own = OwnNamespaces.read()
    with unshared("--net") as pid:
        by_links = own.of(Path(f"/proc/{pid}"))
        by_tables = own.of(without_ns_links(tmp_path / "other", f"/proc/{pid}"))
        theirs = os.readlink(f"/proc/{pid}/ns/net")
    assert by_links == Namespaces(
        Sharing.OTHER, Sharing.SAME, theirs, os.readlink("/proc/self/ns/pid")
    )
    assert (by_tables.net, by_tables.pid) == (Sharing.OTHER, Sharing.SAME)
    assert not by_links.here and not by_tables.here
    assert by_links.elsewhere(own.shown) == (
        f"in another network namespace ({theirs}; init's is {own.shown.net_id})"
    )


def test_a_process_in_another_pid_namespace_is_told_apart_every_way(tmp_path: Path) -> None:
    own = OwnNamespaces.read()
    with unshared("--pid", "--fork") as pid:
        by_links = own.of(Path(f"/proc/{pid}"))
        by_nspid = own.of(without_ns_links(tmp_path / "other", f"/proc/{pid}"))
    assert (by_links.net, by_links.pid) == (Sharing.SAME, Sharing.OTHER)
    assert (by_nspid.net, by_nspid.pid) == (Sharing.SAME, Sharing.OTHER)
    assert by_links.elsewhere(own.shown).startswith("in another PID namespace (pid:[")


def test_what_cannot_be_read_is_unknown_and_never_here(tmp_path: Path) -> None:
    own = OwnNamespaces.read()
    nothing = own.of(tmp_path)
    assert (nothing.net, nothing.pid) == (Sharing.UNKNOWN, Sharing.UNKNOWN)
    assert nothing.elsewhere(own.shown) == "in a network namespace init could not read"
    # An NSpid line tells only where init's own /proc is its own namespace's.
    (tmp_path / "status").write_text("Name:\tollama\nNSpid:\t4242\n")
    nested = OwnNamespaces(None, None, None, 2, HERE)
    assert nested.of(tmp_path).pid is Sharing.UNKNOWN
    assert OwnNamespaces(None, None, None, 1, HERE).of(tmp_path).pid is Sharing.SAME
