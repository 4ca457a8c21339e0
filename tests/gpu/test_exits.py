"""Attribution behind pidfds: a steady sample reads nothing from /proc, an exit or a reused
PID is read afresh, and the descriptors stay within their bounds."""

from __future__ import annotations

import errno
import fcntl
import os
import resource
import select
import signal
import subprocess
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from gpugate.config.model import ExternalService, ProcessMatch
from gpugate.core.observation import OTHER, Owner, OwnerKind
from gpugate.gpu.attribution import MatchKind, ProcessAttributor
from gpugate.gpu.exits import MAX_WATCHED, ExitWatch, pidfds_available, same_pid_namespace
from gpugate.gpu.nvml import HostSample
from gpugate.gpu.sampler import Sampler
from tests.gpu.proctree import ProcTree
from tests.gpu.support import consumer


def _kernel_has_pidfds() -> bool:
    if not pidfds_available():
        return False
    try:
        os.close(os.pidfd_open(os.getpid()))
    except OSError:
        return False
    return True


pytestmark = pytest.mark.skipif(not _kernel_has_pidfds(), reason="no pidfd_open here")

OLLAMA = consumer("ollama", ProcessMatch(units=("ollama.service",)))
PLEX = ExternalService("plex", ProcessMatch(names=("Plex Transcoder",)))


@pytest.fixture
def marker() -> str:
    return f"gpugate-exits-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def start(
    marker: str, spawned: list[subprocess.Popen[bytes]]
) -> Callable[[], subprocess.Popen[bytes]]:
    """Starts a sleeping process whose command line carries `marker`."""

    def start_one() -> subprocess.Popen[bytes]:
        proc = subprocess.Popen([marker, "600"], executable="sleep", start_new_session=True)
        spawned.append(proc)
        # Popen may return (vfork) once the child's execve has taken its new memory but
        # before the kernel has written the new argv there: /proc/PID/cmdline is empty for
        # that moment. A process NVML lists has long passed it; wait for it here.
        cmdline = Path(f"/proc/{proc.pid}/cmdline")
        deadline = time.monotonic() + 10.0
        while not cmdline.read_bytes().startswith(marker.encode()):
            assert time.monotonic() < deadline, f"{proc.pid} never showed its argv"
            os.sched_yield()
        return proc

    return start_one


def end(proc: subprocess.Popen[bytes]) -> None:
    """Kill and reap: the PID is free for the kernel to give away."""
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def probe(
    marker: str,
    *,
    proc_root: Path = Path("/proc"),
    watch_exits: bool | None = None,
    exits: ExitWatch | None = None,
) -> ProcessAttributor:
    """Claims the processes `start` starts; over the real /proc unless told otherwise."""
    rule = consumer("probe", ProcessMatch(commands=(marker,)))
    return ProcessAttributor([rule], proc_root=proc_root, watch_exits=watch_exits, exits=exits)


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


PROBE = Owner(OwnerKind.CONSUMER, "probe")


def test_this_namespaces_proc_is_watched_and_a_fake_tree_is_not(
    tmp_path: Path, marker: str, start: Callable[[], subprocess.Popen[bytes]]
) -> None:
    pid = start().pid
    real, fake = probe(marker), probe(marker, proc_root=tmp_path)

    real.attribute([pid])
    fake.attribute([pid])

    assert same_pid_namespace("/proc") and not same_pid_namespace(str(tmp_path))
    assert (real.watched, fake.watched) == (1, 0)


def test_a_steady_sample_reads_nothing_from_proc(
    marker: str, start: Callable[[], subprocess.Popen[bytes]]
) -> None:
    pids = [start().pid for _ in range(4)]
    watched, stat_read = probe(marker), probe(marker, watch_exits=False)
    first = watched.attribute(pids)
    reads_before = watched.reads

    again = watched.attribute(pids)

    assert again == first == stat_read.attribute(pids)
    assert {a.owner for a in again.values()} == {PROBE}
    assert watched.reads == reads_before
    assert watched.watched == 4


def test_an_exited_process_is_noticed_and_read_again(
    marker: str, start: Callable[[], subprocess.Popen[bytes]]
) -> None:
    gone, stays = start(), start()
    attributor = probe(marker)
    attributor.attribute([gone.pid, stays.pid])
    end(gone)
    reads_before = attributor.reads

    found = attributor.attribute([gone.pid, stays.pid])

    # Its pidfd fired: its stat is read (and found missing), the other PID's is not.
    assert attributor.reads - reads_before == 1
    assert attributor.watched == 1
    # NVML still lists it (its memory is not back yet): it is still whoever it was.
    assert found[gone.pid].owner == PROBE
    assert found[stays.pid].owner == PROBE
    attributor.attribute([stays.pid])
    assert attributor.attribute([gone.pid])[gone.pid].match is MatchKind.VANISHED


def test_a_zombie_keeps_its_owner_while_nvml_lists_it(
    marker: str, start: Callable[[], subprocess.Popen[bytes]]
) -> None:
    zombie = start()
    attributor = probe(marker)
    before = attributor.attribute([zombie.pid])[zombie.pid]
    exited = os.pidfd_open(zombie.pid)
    try:
        os.killpg(zombie.pid, signal.SIGKILL)  # not reaped: its /proc entry stays
        assert select.select([exited], [], [], 5.0)[0] == [exited]
    finally:
        os.close(exited)

    found = attributor.attribute([zombie.pid])[zombie.pid]

    assert found == before
    assert found.owner == PROBE


def test_a_reused_pid_is_not_taken_for_the_process_it_was(
    tmp_path: Path, start: Callable[[], subprocess.Popen[bytes]]
) -> None:
    # A PID cannot be handed to a new process on demand; a proc tree stands in for what
    # /proc shows under a real PID, whose process the attributor's pidfd watches.
    old = start()
    tree = ProcTree(tmp_path / "proc")
    tree.add(old.pid, comm="ollama", cgroup="0::/system.slice/ollama.service", start_time=5000)
    attributor = ProcessAttributor([OLLAMA], [PLEX], proc_root=tree.root, watch_exits=True)
    assert attributor.attribute([old.pid])[old.pid].owner == Owner(OwnerKind.CONSUMER, "ollama")
    # What the PID will read as once another process has it.
    tree.add(old.pid, comm="Plex Transcoder", start_time=9000)

    # While the old process lives, its pidfd vouches for the record: nothing is read.
    reads_before = attributor.reads
    still = attributor.attribute([old.pid])[old.pid]
    assert still.owner == Owner(OwnerKind.CONSUMER, "ollama")
    assert attributor.reads == reads_before

    end(old)
    reused = attributor.attribute([old.pid])[old.pid]

    assert reused.owner == Owner(OwnerKind.EXTERNAL, "plex")
    assert reused.match is MatchKind.NAME


def test_pidfds_of_pids_nvml_no_longer_lists_are_closed(
    marker: str, start: Callable[[], subprocess.Popen[bytes]]
) -> None:
    pids = [start().pid for _ in range(3)]
    before = open_fds()
    attributor = probe(marker)  # and its epoll set

    attributor.attribute(pids)
    assert (attributor.watched, open_fds()) == (3, before + 1 + 3)
    attributor.attribute(pids[:2])
    assert (attributor.watched, open_fds()) == (2, before + 1 + 2)
    attributor.attribute([])
    assert (attributor.watched, open_fds()) == (0, before + 1)
    attributor.close()
    assert open_fds() == before


def test_close_lets_go_and_proc_is_read_after(
    marker: str, start: Callable[[], subprocess.Popen[bytes]]
) -> None:
    pids = [start().pid for _ in range(2)]
    attributor = probe(marker)
    first = attributor.attribute(pids)

    attributor.close()
    reads_before = attributor.reads
    after = attributor.attribute(pids)

    assert after == first
    assert attributor.watched == 0
    assert attributor.reads - reads_before == 2  # a stat read each


def test_closing_the_sampler_closes_the_attributors_pidfds(
    marker: str, start: Callable[[], subprocess.Popen[bytes]]
) -> None:
    class NoDevices:
        def read(self) -> HostSample:
            return HostSample("", ())

        def close(self) -> None:
            pass

    attributor = probe(marker)
    attributor.attribute([start().pid])
    sampler = Sampler(NoDevices(), attributor)

    sampler.close()

    assert attributor.watched == 0


def test_pidfds_beyond_the_bound_leave_their_pids_to_proc(
    marker: str, start: Callable[[], subprocess.Popen[bytes]]
) -> None:
    pids = [start().pid for _ in range(4)]
    bounded = probe(marker, exits=ExitWatch(max_watched=2))
    first = bounded.attribute(pids)
    reads_before = bounded.reads

    again = bounded.attribute(pids)

    assert again == first == probe(marker, watch_exits=False).attribute(pids)
    assert bounded.watched == 2
    assert bounded.reads - reads_before == 2  # one stat read per PID not watched


def test_a_kernel_that_refuses_pidfds_leaves_proc_reads(
    marker: str, start: Callable[[], subprocess.Popen[bytes]]
) -> None:
    def refuse(pid: int) -> int:
        raise OSError(errno.ENOSYS, "pidfd_open")

    pid = start().pid
    watch = ExitWatch(open_pidfd=refuse)
    attributor = probe(marker, exits=watch)
    attributor.attribute([pid])
    reads_before = attributor.reads

    found = attributor.attribute([pid])[pid]

    assert found.owner == PROBE
    assert (attributor.watched, watch.enabled) == (0, False)
    assert attributor.reads - reads_before == 1


def test_the_open_files_limit_bounds_the_pidfds() -> None:
    assert ExitWatch(fd_limit=lambda: 1600).capacity == 100
    assert ExitWatch(fd_limit=lambda: 1 << 24).capacity == MAX_WATCHED


def test_a_table_filling_up_keeps_no_pidfd(start: Callable[[], subprocess.Popen[bytes]]) -> None:
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 4000:
        pytest.skip("needs descriptors numbered past 3000")
    handed: list[int] = []

    def numbered_high(pid: int) -> int:
        # The kernel hands out the lowest free number: a high one means a full table.
        low = os.pidfd_open(pid)
        try:
            handed.append(fcntl.fcntl(low, fcntl.F_DUPFD_CLOEXEC, 3000))
        finally:
            os.close(low)
        return handed[-1]

    watch = ExitWatch(open_pidfd=numbered_high, fd_limit=lambda: 4000)

    assert not watch.watch(start().pid)
    assert len(watch) == 0
    with pytest.raises(OSError):
        os.fstat(handed[0])  # closed again


def test_a_lowered_limit_takes_pidfds_back(start: Callable[[], subprocess.Popen[bytes]]) -> None:
    limit = [1 << 16]
    watch = ExitWatch(fd_limit=lambda: limit[0])
    pids = [start().pid for _ in range(3)]
    assert all(watch.watch(pid) for pid in pids)

    limit[0] = 2 * 16
    let_go = watch.exited()

    assert len(let_go) == 1 and len(watch) == 2
    assert set(let_go) | {pid for pid in pids if pid in watch} == set(pids)


def test_the_watch_reports_an_exit_once(start: Callable[[], subprocess.Popen[bytes]]) -> None:
    gone, stays = start(), start()
    watch = ExitWatch()
    assert watch.watch(gone.pid) and watch.watch(stays.pid)
    assert watch.exited() == []

    end(gone)

    assert watch.exited() == [gone.pid]
    assert watch.exited() == []
    assert gone.pid not in watch and stays.pid in watch
    assert not watch.watch(gone.pid)  # reaped: there is nothing to watch


def test_other_owner_for_an_unclaimed_watched_process(
    start: Callable[[], subprocess.Popen[bytes]],
) -> None:
    pid = start().pid
    attributor = ProcessAttributor([OLLAMA], [PLEX])

    found = attributor.attribute([pid])[pid]
    again = attributor.attribute([pid])[pid]

    assert found == again
    assert (found.owner, found.match) == (Owner(OwnerKind.EXTERNAL, OTHER), MatchKind.NONE)
    assert attributor.watched == 1
