"""The simulated incident host as `gpugate init` meets it on a real machine.

The incident card of 2026-07-10 (gpugate_sim/data/incident-2026-07-10.yaml) with its
runtimes on free ports, plus the two external GPU users init recognises: a Plex Media
Server with a transcode holding 1.5 GiB, and a Tdarr node whose ffmpeg holds 600 MiB.

What systemd would add on a real host is faked the way the suite fakes systemctl:

* a proc root that is the real /proc restricted to the host's process tree (each process a
  directory of links to its real /proc files), where each runtime's `cgroup` names the unit
  systemd would have started it in, its children included;
* a `systemctl` first on PATH (tests/init/fake_systemctl.py) that answers `show` for those
  units from a JSON file.

ComfyUI's models folder is where ComfyUI keeps it, next to its main.py (relative to the
process's working directory): sparse files of the incident's sizes.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import stat
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path

import attrs
import pytest
import yaml

from gpugate.commands.demo import DEFAULT_HOST, move_ports
from gpugate_sim.host import SimulatedHost
from gpugate_sim.scenario import load_host
from gpugate_sim.shim import STATE_ENV

MiB = 1024 * 1024
FIXED = frozenset({11434, 11435, 8188, 8189, 8080, 8081, 9411, 7860, 7861})
"""The demo's ports: never taken by a test."""
ROLES = ("ollama", "comfyui", "whisper")
INCIDENT_PORTS = {"ollama": 11435, "comfyui": 8189, "whisper": 8081}
"""Where the incident file puts each runtime."""

UNITS = {
    "ollama": "ollama.service",
    "comfyui": "comfyui.service",
    "whisper": "whisper-server.service",
    "plex": "plexmediaserver.service",
}
"""The unit each part runs in; Tdarr and mVoice were started by hand."""

EXTRA_HOLDERS = [
    {
        "name": "Plex Media Serv",
        "command": ["/usr/lib/plexmediaserver/Plex Media Server"],
        "bytes": 0,
        "children": [
            {
                "name": "Plex Transcoder",
                "command": ["/usr/lib/plexmediaserver/Plex Transcoder", "-codec:0", "hevc",
                            "-hwaccel", "nvdec", "-i", "/media/film.mkv"],
                "bytes": 1536 * MiB,
            }
        ],
    },
    {
        "name": "Tdarr_Node",
        "command": ["/opt/tdarr/Tdarr_Node/Tdarr_Node"],
        "bytes": 0,
        "children": [
            {
                "name": "ffmpeg",
                "command": ["/opt/tdarr/Tdarr_Node/assets/app/ffmpeg/ffmpeg", "-hwaccel", "cuda",
                            "-i", "/media/show.mkv", "-c:v", "hevc_nvenc", "/tmp/out.mkv"],
                "bytes": 600 * MiB,
            }
        ],
    },
]  # fmt: skip

OLLAMA_ORIGINS = "http://lan.example:3000"


def bindable(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def port_pairs(count: int) -> list[int]:
    """`count` ports P, each with P+1 free too, none next to another or a demo port."""
    found: list[int] = []
    while len(found) < count:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = int(sock.getsockname()[1])
        near = {p + d for p in found for d in (-2, -1, 0, 1, 2)}
        if port in near or {port, port + 1} & FIXED or port + 1 > 65535:
            continue
        if bindable(port + 1):
            found.append(port)
    return found


def host_yaml(ports: Mapping[str, int], path: Path) -> Path:
    """The incident host with its runtimes on `ports`, plus Plex and Tdarr; faster loads."""
    moves = {INCIDENT_PORTS[role]: ports[role] for role in ROLES}
    host = move_ports(yaml.safe_load(DEFAULT_HOST.read_text()), moves)
    host["holders"] = [*host.get("holders", []), *EXTRA_HOLDERS]
    for model in host["ollama"]["models"]:
        model["load_seconds"] = "50ms"
    host["whisper"]["load_seconds"] = "50ms"
    path.write_text(yaml.safe_dump(host, sort_keys=False))
    return path


def comfyui_models(cwd: Path) -> dict[str, int]:
    """ComfyUI's folder under `cwd`, its models as sparse files of the incident's sizes."""
    spec = yaml.safe_load(DEFAULT_HOST.read_text())["comfyui"]["models"]
    files: dict[str, int] = {}
    for folder, entries in spec.items():
        for name, text in entries.items():
            nbytes = int(str(text).removesuffix("MiB")) * MiB
            path = cwd / "ComfyUI" / "models" / folder / name
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(path, "wb") as fh:
                fh.truncate(nbytes)
            files[f"{folder}/{name}"] = nbytes
    (cwd / "ComfyUI" / "main.py").write_text(
        "# the simulated ComfyUI runs as gpugate_sim.comfyui\n"
    )
    return files


def _ppid(pid: int) -> int | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(text.rsplit(")", 1)[1].split()[1])


def descendants(roots: list[int]) -> dict[int, int]:
    """Every live process under `roots`, mapped to its root."""
    parents = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            ppid = _ppid(int(entry.name))
            if ppid is not None:
                parents[int(entry.name)] = ppid
    tree = {root: root for root in roots}
    changed = True
    while changed:
        changed = False
        for pid, ppid in parents.items():
            if pid not in tree and ppid in tree:
                tree[pid] = tree[ppid]
                changed = True
    return tree


def role_of(pid: int) -> str:
    """Which part of the host a top-level process is, by its command line."""
    words = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
    line = " ".join(w for w in words if w)
    for role, marker in (
        ("ollama", "gpugate_sim.ollama"),
        ("comfyui", "ComfyUI/main.py"),
        ("whisper", "whisper-server"),
        ("plex", "Plex Media Server"),
        ("tdarr", "Tdarr_Node"),
        ("mvoice", "mvoice_server.py"),
    ):
        if marker in line:
            return role
    raise AssertionError(f"pid {pid} is no part of the simulated host: {line}")


PROC_LINKS = ("stat", "status", "comm", "cmdline", "environ", "fd", "cwd", "ns")


def restricted_proc(root: Path, tree: Mapping[int, int], roles: Mapping[int, str]) -> Path:
    """A proc root of `tree`'s processes only, each in its role's unit (if it has one)."""
    if root.exists():
        shutil.rmtree(root)
    root.mkdir(parents=True)
    (root / "net").symlink_to("/proc/net")
    for pid, top in tree.items():
        directory = root / str(pid)
        directory.mkdir()
        for name in PROC_LINKS:
            (directory / name).symlink_to(f"/proc/{pid}/{name}")
        unit = UNITS.get(roles[top])
        cgroup = f"/system.slice/{unit}" if unit else "/user.slice/user-0.slice/session-1.scope"
        (directory / "cgroup").write_text(f"0::{cgroup}\n")
    return root


def unit_specs(ports: Mapping[str, int]) -> dict[str, dict]:
    """What the fake systemctl says of each unit: the commands their processes show."""
    return {
        UNITS["ollama"]: {
            "ExecStart": ["/usr/local/bin/ollama", "serve"],
            "Environment": {"OLLAMA_HOST": f"127.0.0.1:{ports['ollama']}",
                            "OLLAMA_ORIGINS": OLLAMA_ORIGINS},
            "User": "ollama",
        },
        UNITS["comfyui"]: {
            "ExecStart": ["/usr/bin/python3", "ComfyUI/main.py", "--listen", "127.0.0.1",
                          "--port", str(ports["comfyui"])],
            "User": "comfyui",
        },
        UNITS["whisper"]: {
            "ExecStart": ["/usr/local/bin/whisper-server", "-m", "models/ggml-large-v3-turbo.bin",
                          "--host", "127.0.0.1", "--port", str(ports["whisper"])],
            "User": "whisper",
        },
        UNITS["plex"]: {
            "ExecStart": ["/usr/lib/plexmediaserver/Plex Media Server"],
            "User": "plex",
        },
    }  # fmt: skip


def fake_systemctl(
    directory: Path, units: Mapping[str, dict], monkeypatch: pytest.MonkeyPatch
) -> Path:
    """The fake `systemctl` first on PATH, knowing `units`; returns the file its calls go to."""
    bin_dir = directory / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    script = bin_dir / "systemctl"
    here = Path(__file__).with_name("fake_systemctl.py")
    script.write_text(f'#!/bin/sh\nexec {sys.executable} {here} "$@"\n')
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    (directory / "units.json").write_text(json.dumps(units))
    log = directory / "systemctl.log"
    log.write_text("")
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_SYSTEMD_UNITS", str(directory / "units.json"))
    monkeypatch.setenv("FAKE_SYSTEMCTL_LOG", str(log))
    return log


@attrs.define
class IncidentHost:
    """A running simulated incident host and the proc root that shows it."""

    host: SimulatedHost
    ports: dict[str, int]
    proc_root: Path
    pids: dict[str, int]
    """The top-level process of each part (ollama, comfyui, whisper, plex, tdarr, mvoice)."""
    tree: dict[int, int]

    def children(self, role: str) -> list[int]:
        top = self.pids[role]
        return sorted(pid for pid, root in self.tree.items() if root == top and pid != top)


def start_incident(
    directory: Path, ports: Mapping[str, int], monkeypatch: pytest.MonkeyPatch
) -> IncidentHost:
    """Start the host (its processes' working directory is `directory`, where ComfyUI's
    folder is) and build its proc root; stop it with `.host.stop()`."""
    monkeypatch.chdir(directory)
    monkeypatch.setenv("OLLAMA_HOST", f"127.0.0.1:{ports['ollama']}")
    monkeypatch.setenv("OLLAMA_ORIGINS", OLLAMA_ORIGINS)
    spec = load_host(host_yaml(ports, directory / f"host-{ports['ollama']}.yaml"))
    host = SimulatedHost(spec, directory / f"state-{ports['ollama']}")
    host.start()
    try:
        assert host.environment is not None
        monkeypatch.setenv(STATE_ENV, str(host.environment.state_path))
        tops = host.pids
        pids = {role_of(pid): pid for pid in tops}
        tree = descendants(tops)
        roles = {pid: role for role, pid in pids.items()}
        proc_root = restricted_proc(directory / "proc", tree, roles)
    except BaseException:
        host.stop()
        raise
    return IncidentHost(host, dict(ports), proc_root, pids, tree)


@pytest.fixture
def incident(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fakenvml_path: Path
) -> Iterator[IncidentHost]:
    """The simulated incident host with its runtimes on free ports, in fake units."""
    ports = dict(zip(ROLES, port_pairs(len(ROLES)), strict=True))
    comfyui_models(tmp_path)
    fake_systemctl(tmp_path / "systemd", unit_specs(ports), monkeypatch)
    running = start_incident(tmp_path, ports, monkeypatch)
    try:
        yield running
    finally:
        running.host.stop()
