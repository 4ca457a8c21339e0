"""Reading a host: /proc as the kernel writes it, `systemctl show` as systemd prints it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gpugate.init.proc import Listener, parse_cgroup, read_listeners, read_processes
from gpugate.init.scan import ask_ollama_ps, comfyui_model_files
from gpugate.init.systemd import parse_show, read_unit
from tests.gpu.proctree import ProcTree
from tests.init.simhost import fake_systemctl
from tests.ports import free_port


def table(header: str, rows: list[tuple[str, str, str, str]]) -> str:
    """/proc/net/tcp{,6} as the kernel writes it: (local, remote, state, inode) rows."""
    tail = "00000000:00000000 00:00000000 00000000  1000        0"
    lines = [header]
    for number, (local, remote, state, inode) in enumerate(rows):
        lines.append(f"{number:4}: {local} {remote} {state} {tail} {inode} 1 0000000000000000 100")
    return "\n".join(lines) + "\n"


V6_ANY = "0" * 32
TCP = table(
    "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  inode",
    [
        ("00000000:2CAA", "00000000:0000", "0A", "41001"),
        ("0100007F:2CAB", "00000000:0000", "0A", "41002"),
        ("0100007F:2CAB", "0100007F:D431", "01", "41003"),  # a connection, not a listener
    ],
)
TCP6 = table(
    "  sl  local_address                         remote_address                        st ...",
    [
        (f"{V6_ANY}:1FFC", f"{V6_ANY}:0000", "0A", "42001"),
        ("00000000000000000000000001000000:1F90", f"{V6_ANY}:0000", "0A", "42002"),
        ("0000000000000000FFFF00000100007F:1F91", f"{V6_ANY}:0000", "0A", "42003"),
    ],
)


def test_listening_sockets_are_read_from_both_tables(tmp_path: Path) -> None:
    (tmp_path / "net").mkdir()
    (tmp_path / "net" / "tcp").write_text(TCP)
    (tmp_path / "net" / "tcp6").write_text(TCP6)
    assert read_listeners(tmp_path) == (
        Listener("::1", 8080, "42002"),
        Listener("127.0.0.1", 8081, "42003"),  # v4-mapped
        Listener("::", 8188, "42001"),
        Listener("0.0.0.0", 11434, "41001"),
        Listener("127.0.0.1", 11435, "41002"),  # the established connection is not listed
    )


def test_a_process_is_read_with_its_unit_environment_and_sockets(tmp_path: Path) -> None:
    tree = ProcTree(tmp_path)
    tree.add(
        700,
        comm="ollama",
        argv=["/usr/local/bin/ollama", "serve"],
        cgroup="0::/system.slice/ollama.service",
    )
    (tmp_path / "700" / "environ").write_bytes(
        b"OLLAMA_HOST=0.0.0.0:11434\0HOME=/usr/share/ollama\0"
    )
    (tmp_path / "700" / "fd").mkdir()
    os.symlink("socket:[41001]", tmp_path / "700" / "fd" / "3")
    os.symlink("/dev/null", tmp_path / "700" / "fd" / "0")
    os.symlink(str(tmp_path), tmp_path / "700" / "cwd")
    # A title rewritten in place: NUL padding after the words.
    tree.add(701, ppid=700, comm="python3", argv=["python3", "ComfyUI/main.py", "", "", ""])
    # Another user's process without root: environ, fd and cwd refused.
    tree.add(
        702,
        comm="Plex Media Serv",
        cgroup="0::/system.slice/plexmediaserver.service",
        argv=["/usr/lib/plexmediaserver/Plex Media Server"],
        unreadable=["environ"],
    )
    (tmp_path / "702" / "fd").mkdir(mode=0)
    processes = read_processes(tmp_path)
    ollama = processes[700]
    assert ollama.argv == ("/usr/local/bin/ollama", "serve")
    assert ollama.env == {"OLLAMA_HOST": "0.0.0.0:11434", "HOME": "/usr/share/ollama"}
    assert ollama.unit == "ollama.service" and not ollama.user_unit
    assert ollama.sockets == frozenset({"41001"})
    assert ollama.cwd == tmp_path
    assert processes[701].argv == ("python3", "ComfyUI/main.py")
    assert processes[701].ppid == 700 and processes[701].cwd is None
    plex = processes[702]
    assert plex.env is None
    assert plex.command == "'/usr/lib/plexmediaserver/Plex Media Server'"
    if os.geteuid() != 0:  # root lists a mode-0 directory anyway
        assert not plex.fds_readable


@pytest.mark.parametrize(
    ("cgroup", "expected"),
    [
        ("0::/system.slice/ollama.service\n", ("ollama.service", False, None)),
        ("0::/user.slice/user-1000.slice/user@1000.service/app.slice/comfyui.service\n",
         ("comfyui.service", True, None)),
        ("0::/user.slice/user-1000.slice/session-2.scope\n", (None, False, None)),
        ("0::/system.slice/docker-3f2a9c.scope\n", (None, False, "docker-3f2a9c.scope")),
        ("12:pids:/docker/3f2a9c\n0::/\n", (None, False, "docker/3f2a9c")),
        ("0::/system.slice/containerd.service/kubepods-besteffort-pod1.slice:cri-containerd:ab\n",
         (None, False, "kubepods-besteffort-pod1.slice:cri-containerd:ab")),
        ("0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod9.slice/"
         "cri-containerd-77e1.scope\n", (None, False, "cri-containerd-77e1.scope")),
        ("1:name=systemd:/system.slice/whisper-server.service\n0::/\n",
         ("whisper-server.service", False, None)),
        ("", (None, False, None)),
    ],
)  # fmt: skip
def test_a_cgroup_names_its_unit_or_its_container(cgroup: str, expected: tuple) -> None:
    assert parse_cgroup(cgroup) == expected


COMFYUI_ARGV = "/opt/ComfyUI/venv/bin/python /opt/ComfyUI/main.py --listen 0.0.0.0 --port 8188"
SHOW = "\n".join(
    [
        "Id=comfyui.service",
        "LoadState=loaded",
        "ActiveState=active",
        "FragmentPath=/etc/systemd/system/comfyui.service",
        "DropInPaths=/etc/systemd/system/comfyui.service.d/override.conf "
        "/run/systemd/system/comfyui.service.d/50-x.conf",
        f"ExecStart={{ path=/opt/ComfyUI/venv/bin/python ; argv[]={COMFYUI_ARGV} ; "
        "ignore_errors=no ; start_time=[n/a] ; stop_time=[n/a] ; pid=0 ; code=(null) ; "
        "status=0/0 }",
        'Environment="PYTHONPATH=/opt/a b" HF_HOME=/srv/hf',
        "EnvironmentFiles=/etc/default/comfyui (ignore_errors=yes)",
        "EnvironmentFiles=/etc/comfyui.env (ignore_errors=no)",
        "User=comfyui",
    ]
)


def test_systemctl_show_is_read_as_systemd_prints_it() -> None:
    unit = parse_show(SHOW, "comfyui.service")
    assert unit.known
    assert unit.exec_start == (
        "/opt/ComfyUI/venv/bin/python", "/opt/ComfyUI/main.py", "--listen", "0.0.0.0",
        "--port", "8188",
    )  # fmt: skip
    assert unit.environment == {"PYTHONPATH": "/opt/a b", "HF_HOME": "/srv/hf"}
    assert unit.environment_files == ("/etc/default/comfyui", "/etc/comfyui.env")
    assert unit.drop_in_paths[0].endswith("override.conf")
    assert unit.user == "comfyui"
    assert not parse_show("Id=x.service\nLoadState=not-found\n", "x.service").known


def test_a_unit_is_read_through_systemctl_and_an_unknown_one_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = fake_systemctl(
        tmp_path,
        {"ollama.service": {"ExecStart": ["/usr/local/bin/ollama", "serve"],
                            "Environment": {"OLLAMA_HOST": "0.0.0.0"}}},
        monkeypatch,
    )  # fmt: skip
    unit = read_unit("ollama.service")
    assert unit.known and unit.exec_start == ("/usr/local/bin/ollama", "serve")
    assert unit.environment == {"OLLAMA_HOST": "0.0.0.0"}
    assert not read_unit("nothing.service").known
    assert [line.split()[0] for line in log.read_text().splitlines()] == ["show", "show"]
    missing = read_unit("ollama.service", systemctl=str(tmp_path / "no-such-systemctl"))
    assert not missing.known and "cannot run" in missing.error


def test_comfyui_s_model_files_are_sized_from_its_folders(tmp_path: Path) -> None:
    models = tmp_path / "models"
    for rel, size in (
        ("checkpoints/sd15.safetensors", 2034),
        ("checkpoints/SDXL/juggernaut.safetensors", 6617),
        ("loras/detail.safetensors", 144),
        ("vae/readme.txt", 1),  # not a model file
        ("embeddings/bad.pt", 1),  # not a folder whose files take the card
    ):
        path = models / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "wb") as fh:
            fh.truncate(size * 1024 * 1024)
    assert comfyui_model_files(models) == [
        ("checkpoints/SDXL/juggernaut.safetensors", 6617 * 1024 * 1024),
        ("checkpoints/sd15.safetensors", 2034 * 1024 * 1024),
        ("loras/detail.safetensors", 144 * 1024 * 1024),
    ]


def test_an_ollama_that_does_not_answer_lists_nothing_and_says_why() -> None:
    models, why = ask_ollama_ps("0.0.0.0", free_port(), timeout=2.0)
    assert models == [] and "/api/ps" in why and "127.0.0.1" in why
