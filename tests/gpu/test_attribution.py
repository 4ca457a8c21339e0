"""PID → owner from a proc tree: rules, ancestry, races and the per-process cache."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from gpugate.config.model import (
    ExternalService,
    ProcessMatch,
)
from gpugate.core.observation import OTHER, Owner, OwnerKind
from gpugate.gpu.attribution import MatchKind, ProcessAttributor
from gpugate_sim.device import pid_alive
from tests.gpu.proctree import ProcTree
from tests.gpu.support import consumer

DOCKER_ID = "3f4e2a9c8b7d6e5f4a3b2c1d0e9f8a7b6c5d4e3f2a1b0c9d8e7f6a5b4c3d2e1f"


OLLAMA = consumer("ollama", ProcessMatch(units=("ollama.service",)))
COMFY = consumer("comfyui", ProcessMatch(commands=("ComfyUI/main.py",)), 8188)
WHISPER = consumer("whisper", ProcessMatch(names=("whisper-server",)), 9000)
PLEX = ExternalService("plex", ProcessMatch(names=("Plex Transcoder",)))
TDARR = ExternalService("tdarr", ProcessMatch(units=(f"docker-{DOCKER_ID}.scope",)))
DESKTOP = ExternalService("desktop", ProcessMatch(units=("plasma-kwin_wayland.service",)))


@pytest.fixture
def tree(tmp_path: Path) -> ProcTree:
    return ProcTree(tmp_path / "proc")


@pytest.fixture
def attributor(tree: ProcTree) -> ProcessAttributor:
    return ProcessAttributor([OLLAMA, COMFY, WHISPER], [PLEX, TDARR, DESKTOP], proc_root=tree.root)


def test_cgroup_v2_unit_names_the_consumer(tree: ProcTree, attributor: ProcessAttributor) -> None:
    tree.add(
        812,
        comm="ollama",
        argv=["/usr/bin/ollama", "serve"],
        cgroup="0::/system.slice/ollama.service",
    )

    found = attributor.explain(812)

    assert found.owner == Owner(OwnerKind.CONSUMER, "ollama")
    assert (found.match, found.matched, found.via, found.name) == (
        MatchKind.UNIT,
        "ollama.service",
        812,
        "ollama",
    )


def test_cgroup_v1_lines_are_read_too(tree: ProcTree, attributor: ProcessAttributor) -> None:
    tree.add(
        813,
        comm="ollama",
        cgroup=(
            "12:pids:/system.slice/ollama.service\n"
            "4:memory:/system.slice/ollama.service\n"
            "1:name=systemd:/system.slice/ollama.service"
        ),
    )

    assert attributor.owner(813) == Owner(OwnerKind.CONSUMER, "ollama")


def test_docker_scope_names_an_external_service(
    tree: ProcTree, attributor: ProcessAttributor
) -> None:
    tree.add(
        4100,
        comm="ffmpeg",
        argv=["ffmpeg", "-hwaccel", "cuda", "-i", "in.mkv"],
        cgroup=f"0::/system.slice/docker-{DOCKER_ID}.scope",
        nspid=[4100, 57],
    )

    found = attributor.explain(4100)

    assert found.owner == Owner(OwnerKind.EXTERNAL, "tdarr")
    assert found.match is MatchKind.UNIT


def test_user_service_is_found_below_user_manager(
    tree: ProcTree, attributor: ProcessAttributor
) -> None:
    tree.add(
        2210,
        comm="kwin_wayland",
        cgroup=(
            "0::/user.slice/user-1000.slice/user@1000.service/session.slice/"
            "plasma-kwin_wayland.service"
        ),
    )

    found = attributor.explain(2210)

    assert found.owner == Owner(OwnerKind.EXTERNAL, "desktop")
    assert found.matched == "plasma-kwin_wayland.service"


def test_user_manager_itself_counts_as_a_unit(tree: ProcTree) -> None:
    everything_of_alice = ExternalService("alice", ProcessMatch(units=("user@1000.service",)))
    attributor = ProcessAttributor([], [everything_of_alice], proc_root=tree.root)
    tree.add(
        2211,
        comm="blender",
        cgroup="0::/user.slice/user-1000.slice/user@1000.service/app.slice/app-blender.scope",
    )

    assert attributor.owner(2211) == Owner(OwnerKind.EXTERNAL, "alice")


def test_comm_is_compared_cut_to_fifteen_characters(tree: ProcTree) -> None:
    plex_server = ExternalService("plex", ProcessMatch(names=("Plex Media Server",)))
    attributor = ProcessAttributor([], [plex_server], proc_root=tree.root)
    tree.add(3000, comm="Plex Media Server")

    found = attributor.explain(3000)

    assert found.owner == Owner(OwnerKind.EXTERNAL, "plex")
    assert (found.match, found.matched) == (MatchKind.NAME, "Plex Media Serv")


def test_plex_transcoder_by_exact_fifteen_character_name(
    tree: ProcTree, attributor: ProcessAttributor
) -> None:
    tree.add(
        3001,
        comm="Plex Transcoder",
        argv=["/usr/lib/plexmediaserver/Plex Transcoder", "-codec:0", "hevc"],
    )

    assert attributor.owner(3001) == Owner(OwnerKind.EXTERNAL, "plex")


def test_command_line_substring_with_arguments_joined_by_spaces(
    tree: ProcTree, attributor: ProcessAttributor
) -> None:
    tree.add(
        5000,
        comm="python3",
        argv=["/opt/venv/bin/python3", "/srv/ComfyUI/main.py", "--listen", "127.0.0.1"],
    )
    spaced = ProcessAttributor(
        [consumer("comfy2", ProcessMatch(commands=("main.py --listen",)))], proc_root=tree.root
    )

    assert attributor.explain(5000).match is MatchKind.COMMAND
    assert attributor.owner(5000) == Owner(OwnerKind.CONSUMER, "comfyui")
    assert spaced.owner(5000) == Owner(OwnerKind.CONSUMER, "comfy2")


def test_consumers_are_matched_before_external_services(tree: ProcTree) -> None:
    ollama = consumer("ollama", ProcessMatch(names=("ollama",)))
    greedy = ExternalService("everything", ProcessMatch(units=("ollama.service",)))
    attributor = ProcessAttributor([ollama], [greedy], proc_root=tree.root)
    tree.add(900, comm="ollama", cgroup="0::/system.slice/ollama.service")

    assert attributor.owner(900) == Owner(OwnerKind.CONSUMER, "ollama")


def test_runner_two_levels_below_serve_belongs_to_it(
    tree: ProcTree, attributor: ProcessAttributor
) -> None:
    # Started by hand from a shell, so there is no unit to go by: only the command line.
    by_command = ProcessAttributor(
        [consumer("ollama", ProcessMatch(commands=("ollama serve",)))], proc_root=tree.root
    )
    tree.add(700, ppid=650, comm="ollama", argv=["ollama", "serve"])
    tree.add(701, ppid=700, comm="ollama", argv=["/usr/bin/ollama", "runner", "--port", "4242"])
    tree.add(
        702,
        ppid=701,
        comm="llama-server",
        argv=["/usr/lib/ollama/llama-server", "--model", "/blobs/sha256-1", "--port", "4243"],
    )
    tree.add(650, ppid=1, comm="bash", argv=["-bash"])

    found = by_command.explain(702)

    assert found.owner == Owner(OwnerKind.CONSUMER, "ollama")
    assert (found.match, found.via, found.name) == (MatchKind.COMMAND, 700, "llama-server")
    assert attributor.owner(702) == Owner(OwnerKind.EXTERNAL, OTHER)


def test_ancestry_that_ends_in_nothing_is_other(
    tree: ProcTree, attributor: ProcessAttributor
) -> None:
    tree.add(1200, ppid=1100, comm="train.py", argv=["python", "train.py"])
    tree.add(1100, ppid=1, comm="tmux: server", argv=["tmux"])

    found = attributor.explain(1200)

    assert found.owner == Owner(OwnerKind.EXTERNAL, OTHER)
    assert (found.match, found.via, found.name) == (MatchKind.NONE, None, "train.py")


def test_pid_one_is_never_an_owner(tree: ProcTree) -> None:
    init_rule = ExternalService("init", ProcessMatch(names=("systemd",)))
    attributor = ProcessAttributor([], [init_rule], proc_root=tree.root)
    tree.add(1, ppid=0, comm="systemd", cgroup="0::/init.scope")
    tree.add(1300, ppid=1, comm="orphan")

    assert attributor.owner(1300) == Owner(OwnerKind.EXTERNAL, OTHER)
    assert attributor.owner(1) == Owner(OwnerKind.EXTERNAL, "init")


def test_parent_cycle_in_a_corrupt_tree_ends(tree: ProcTree, attributor: ProcessAttributor) -> None:
    tree.add(1400, ppid=1401, comm="a")
    tree.add(1401, ppid=1400, comm="b")

    assert attributor.explain(1400).match is MatchKind.NONE


def test_ancestry_depth_is_bounded(tree: ProcTree) -> None:
    attributor = ProcessAttributor(
        [consumer("ollama", ProcessMatch(names=("ollama",)))], proc_root=tree.root, max_ancestry=3
    )
    tree.add(2000, ppid=1, comm="ollama")
    for pid in range(2001, 2006):
        tree.add(pid, ppid=pid - 1, comm="child")

    assert attributor.owner(2003) == Owner(OwnerKind.CONSUMER, "ollama")  # 3 levels up
    assert attributor.owner(2004) == Owner(OwnerKind.EXTERNAL, OTHER)  # 4 levels up


def test_vanished_pid_is_other_without_error(tree: ProcTree, attributor: ProcessAttributor) -> None:
    tree.add(812, comm="ollama", cgroup="0::/system.slice/ollama.service")
    tree.remove(812)

    found = attributor.attribute([812, 99999])

    assert {pid: a.match for pid, a in found.items()} == {
        812: MatchKind.VANISHED,
        99999: MatchKind.VANISHED,
    }
    assert {a.owner for a in found.values()} == {Owner(OwnerKind.EXTERNAL, OTHER)}


def test_a_process_that_left_proc_but_not_nvml_keeps_its_owner(
    tree: ProcTree, attributor: ProcessAttributor
) -> None:
    tree.add(812, comm="ollama", cgroup="0::/system.slice/ollama.service")
    assert attributor.attribute([812])[812].owner == Owner(OwnerKind.CONSUMER, "ollama")
    tree.remove(812)  # exiting: gone from /proc, still listed by NVML with its memory

    still = attributor.attribute([812])[812]
    assert still.owner == Owner(OwnerKind.CONSUMER, "ollama")
    # Once NVML stops listing it, it is forgotten: a later PID 812 starts afresh.
    attributor.attribute([])
    assert attributor.attribute([812])[812].match is MatchKind.VANISHED


def test_parent_that_vanished_mid_walk_ends_the_walk(
    tree: ProcTree, attributor: ProcessAttributor
) -> None:
    tree.add(1501, ppid=1500, comm="orphan-to-be")

    assert attributor.explain(1501).match is MatchKind.NONE


def test_reused_pid_with_new_start_time_is_attributed_afresh(
    tree: ProcTree, attributor: ProcessAttributor
) -> None:
    tree.add(4242, comm="ollama", cgroup="0::/system.slice/ollama.service", start_time=5000)
    assert attributor.attribute([4242])[4242].owner.name == "ollama"

    tree.add(
        4242,
        comm="Plex Transcoder",
        cgroup="0::/system.slice/plexmediaserver.service",
        start_time=9000,
    )

    assert attributor.attribute([4242])[4242].owner == Owner(OwnerKind.EXTERNAL, "plex")


def test_same_pid_and_start_time_is_served_from_cache_with_one_read(
    tree: ProcTree, attributor: ProcessAttributor
) -> None:
    pids = list(range(6000, 6030))
    tree.add(
        5999, comm="ollama", argv=["ollama", "serve"], cgroup="0::/system.slice/ollama.service"
    )
    for pid in pids:
        tree.add(pid, ppid=5999, comm="llama-server", cgroup="0::/system.slice/ollama.service")
    first = attributor.attribute(pids)
    reads_before = attributor.reads

    again = attributor.attribute(pids)

    assert again == first
    assert attributor.reads - reads_before == len(pids)  # one stat read each


def test_cache_forgets_processes_missing_from_the_latest_sample(
    tree: ProcTree, attributor: ProcessAttributor
) -> None:
    tree.add(7000, comm="whisper-server")
    tree.add(7001, comm="whisper-server")
    attributor.attribute([7000, 7001])
    attributor.attribute([7000])
    reads_before = attributor.reads

    attributor.attribute([7001])

    assert attributor.reads - reads_before > 1  # 7001 was read in full again


def test_unreadable_cgroup_degrades_to_command_line(
    tree: ProcTree, attributor: ProcessAttributor
) -> None:
    tree.add(
        5100,
        comm="python3",
        argv=["python3", "/srv/ComfyUI/main.py"],
        cgroup="0::/system.slice/comfyui.service",
        unreadable=["cgroup"],
    )

    found = attributor.explain(5100)

    assert found.owner == Owner(OwnerKind.CONSUMER, "comfyui")
    assert found.match is MatchKind.COMMAND


def test_unreadable_stat_falls_back_to_status_for_the_parent(
    tree: ProcTree, attributor: ProcessAttributor
) -> None:
    tree.add(5200, comm="whisper-server")
    tree.add(5201, ppid=5200, comm="worker", unreadable=["stat", "cmdline"])

    found = attributor.explain(5201)

    assert found.owner == Owner(OwnerKind.CONSUMER, "whisper")
    assert found.via == 5200


def test_everything_unreadable_is_other(tree: ProcTree, attributor: ProcessAttributor) -> None:
    tree.add(
        5300,
        comm="ollama",
        cgroup="0::/system.slice/ollama.service",
        unreadable=["stat", "status", "comm", "cmdline", "cgroup"],
    )

    found = attributor.explain(5300)

    assert (found.owner, found.match) == (Owner(OwnerKind.EXTERNAL, OTHER), MatchKind.NONE)


def test_garbage_in_proc_files_is_not_a_crash(
    tree: ProcTree, attributor: ProcessAttributor
) -> None:
    tree.add(5400, comm="ollama", cgroup="0::/system.slice/ollama.service")
    (tree.root / "5400" / "stat").write_bytes(b"5400 (x) S not-a-number\xff")
    (tree.root / "5400" / "status").write_bytes(b"PPid:\tzz\nNSpid:\t\xfe 3\n")

    assert attributor.owner(5400) == Owner(OwnerKind.CONSUMER, "ollama")


def test_empty_rules_match_nothing(tree: ProcTree) -> None:
    blank = ProcessAttributor(
        [consumer("blank", ProcessMatch(commands=("",), names=("",)))], proc_root=tree.root
    )
    tree.add(5500, comm="anything", argv=["anything"])

    assert blank.owner(5500) == Owner(OwnerKind.EXTERNAL, OTHER)


# -- the real /proc ---------------------------------------------------------------------


@pytest.fixture
def marker() -> str:
    return f"gpugate-probe-{uuid.uuid4().hex[:12]}"


def test_real_process_is_attributed_by_its_argv(
    marker: str, spawned: list[subprocess.Popen[bytes]]
) -> None:
    # Popen returns once exec has succeeded, so /proc already shows the new argv.
    sleeper = subprocess.Popen([marker, "30"], executable="sleep", start_new_session=True)
    spawned.append(sleeper)
    attributor = ProcessAttributor([consumer("probe", ProcessMatch(commands=(marker,)))])

    found = attributor.explain(sleeper.pid)

    assert found.owner == Owner(OwnerKind.CONSUMER, "probe")
    assert (found.match, found.via, found.name) == (MatchKind.COMMAND, sleeper.pid, "sleep")


def test_real_child_belongs_to_its_real_parent(
    marker: str, spawned: list[subprocess.Popen[bytes]]
) -> None:
    # The child prints its PID only once it runs its own program, so its argv is final.
    child_code = "import os, signal; print(os.getpid(), flush=True); signal.pause()"
    parent = subprocess.Popen(
        [marker, "-c", f'"$0" -c "{child_code}" & wait', sys.executable],
        executable="/bin/sh",
        stdout=subprocess.PIPE,
        start_new_session=True,
    )
    spawned.append(parent)
    assert parent.stdout is not None
    child = int(parent.stdout.readline())
    attributor = ProcessAttributor([consumer("probe", ProcessMatch(commands=(marker,)))])

    found = attributor.explain(child)

    assert found.owner == Owner(OwnerKind.CONSUMER, "probe")
    assert found.via == parent.pid
    assert found.name == Path(f"/proc/{child}/comm").read_text().rstrip("\n")
    # The child is not ours to wait for; its pidfd turns readable when it has exited.
    child_exit = os.pidfd_open(child)
    try:
        os.killpg(parent.pid, signal.SIGKILL)
        parent.wait()
        assert select.select([child_exit], [], [], 5.0)[0] == [child_exit]
    finally:
        os.close(child_exit)
    assert not pid_alive(parent.pid)
    assert not pid_alive(child)
