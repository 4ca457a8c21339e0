"""Two simulated hosts on one machine, in two network namespaces: `gpugate init` run on the
first proposes only what runs in its own namespaces.

The first host is the incident host (tests/init/simhost.py), in the test's own namespaces.
The second is another simulated host whose Ollama listens on every address
(`OLLAMA_HOST=0.0.0.0:PORT`), started by `gpugate sim run` inside `unshare --net` (a new
network namespace, with a user namespace so that no privilege is needed): its processes
share this PID namespace, so /proc shows them, as a container's are shown on a real host.
Fronting that Ollama would have the gate take its port here, and its move to loopback
would cut off every client it has in its own namespace. The same second host started in
this namespace is proposed, with the restart that keeps its environment.
"""

from __future__ import annotations

import contextlib
import io
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import attrs
import pytest
import yaml

from gpugate.cli import main
from gpugate.commands.demo import DEFAULT_HOST
from gpugate.init.write import split_dry_run
from gpugate.runtimes.sections import load_config_text_with_warnings
from gpugate_sim.host import READY_COMMENT
from tests.init.simhost import IncidentHost, descendants, port_pairs, restricted_proc
from tests.ports import free_port
from tests.sim.processes import LineReader, kill_quietly

OTHER_MODELS = "/srv/other-host/models"
STOP_TIMEOUT = 60


@attrs.frozen
class OtherHost:
    """The second simulated host: `gpugate sim run`'s process and its Ollama's."""

    popen: subprocess.Popen[str]
    ollama: int
    port: int


def _other_host_yaml(directory: Path, port: int) -> Path:
    """The incident card with an Ollama only, on every address at `port`."""
    incident = yaml.safe_load(DEFAULT_HOST.read_text())
    ollama = dict(incident["ollama"], listen=f"0.0.0.0:{port}")
    for model in ollama["models"]:
        model["load_seconds"] = "50ms"
    host = {key: incident[key] for key in ("driver", "cuda", "gpus")} | {"ollama": ollama}
    path = directory / f"other-host-{port}.yaml"
    path.write_text(yaml.safe_dump(host, sort_keys=False))
    return path


@contextlib.contextmanager
def other_host(directory: Path, port: int, *, own_network: bool) -> Iterator[OtherHost]:
    """The second host, in a network namespace of its own or in this one."""
    argv = [sys.executable, "-m", "gpugate", "sim", "run", str(_other_host_yaml(directory, port)),
            "--state-dir", str(directory / f"other-state-{port}")]  # fmt: skip
    if own_network:
        argv = ["unshare", "--user", "--map-root-user", "--net", *argv]
    env = dict(os.environ, OLLAMA_HOST=f"0.0.0.0:{port}", OLLAMA_MODELS=OTHER_MODELS)
    popen = subprocess.Popen(
        argv, env=env, stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        assert popen.stdout is not None
        LineReader(popen.stdout).until(READY_COMMENT, timeout=90)
        (ollama,) = [
            pid
            for pid in descendants([popen.pid])
            if "gpugate_sim.ollama" in Path(f"/proc/{pid}/cmdline").read_text()
            and Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1] == str(popen.pid)
        ]
        yield OtherHost(popen, ollama, port)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(popen.pid, signal.SIGTERM)
        try:
            popen.wait(timeout=STOP_TIMEOUT)
        finally:
            kill_quietly(popen)


def proc_of_both(incident: IncidentHost, other: OtherHost, root: Path) -> Path:
    """A proc root of both hosts' processes (the second's started by hand: no unit)."""
    tree = dict(incident.tree) | descendants([other.popen.pid])
    roles = {pid: role for role, pid in incident.pids.items()} | {other.popen.pid: "other"}
    return restricted_proc(root, tree, roles)


def run_dry(proc_root: Path, library: Path, tmp: Path, *extra: str) -> dict[str, str]:
    out, err = io.StringIO(), io.StringIO()
    argv = [
        "init", "--dry-run", "--proc-root", str(proc_root), "--nvml-library", str(library),
        "--control", f"127.0.0.1:{free_port()}", "--database", str(tmp / "gpugate.db"),
        "--out", str(tmp / "proposal"), *extra,
    ]  # fmt: skip
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    assert code == 0, err.getvalue()
    return split_dry_run(out.getvalue())


def consumers(files: dict[str, str], tmp: Path) -> dict[str, str]:
    """Each consumer's name and listen address, as the printed file loads."""
    loaded = load_config_text_with_warnings(files["consumers.yaml"], tmp / "consumers.yaml")
    return {c.name: str(c.listen) for c in loaded.config.consumers}


def moves(files: dict[str, str]) -> str:
    return files["moves.txt"]


def flat(text: str) -> str:
    return " ".join(text.split())


@pytest.fixture
def other_port() -> int:
    (port,) = port_pairs(1)
    return port


def test_an_ollama_in_another_network_namespace_is_never_proposed(
    incident: IncidentHost, fakenvml_path: Path, tmp_path: Path, other_port: int
) -> None:
    with other_host(tmp_path, other_port, own_network=True) as other:
        theirs = os.readlink(f"/proc/{other.ollama}/ns/net")
        ours = os.readlink("/proc/self/ns/net")
        assert theirs != ours
        proc_root = proc_of_both(incident, other, tmp_path / "proc-both")
        files = run_dry(proc_root, fakenvml_path, tmp_path)
        named = run_dry(proc_root, fakenvml_path, tmp_path, "--pid", str(other.ollama))

    # Only the first host's runtimes, each where it listens; nothing of the other.
    assert consumers(files, tmp_path) == {
        role: f"127.0.0.1:{incident.ports[role]}" for role in ("whisper", "ollama", "comfyui")
    }
    assert str(other_port) not in files["consumers.yaml"]
    assert list(files) == [
        "consumers.yaml",
        "whisper-server.service.d/gpugate.conf",
        "ollama.service.d/gpugate.conf",
        "comfyui.service.d/gpugate.conf",
        "gpugate.service",
        "moves.txt",
    ]
    assert f"kill {other.ollama}" not in moves(files)
    assert flat(
        f"ollama pid {other.ollama} not fronted: it runs in another network namespace "
        f"({theirs}; init's is {ours}): its addresses are that namespace's, not this one's; "
        f"name it (--pid {other.ollama}) to propose it all the same"
    ) in flat(moves(files))

    # Named, it is proposed where it says it listens, and nothing here moves it: its port
    # is to be forwarded from its namespace.
    assert consumers(named, tmp_path) == {
        "whisper": f"127.0.0.1:{incident.ports['whisper']}",
        f"ollama-{incident.ports['ollama']}": f"127.0.0.1:{incident.ports['ollama']}",
        "comfyui": f"127.0.0.1:{incident.ports['comfyui']}",
        f"ollama-{other_port}": f"0.0.0.0:{other_port}",
    }
    assert f"kill {other.ollama}" not in moves(named)
    assert not [path for path in named if path.endswith(".env")]
    assert flat(
        f"Forward ollama-{other_port}'s port from its network namespace to "
        f"127.0.0.1:{other_port + 1} here instead of 0.0.0.0:{other_port}; to undo, forward "
        f"it to 0.0.0.0:{other_port} again."
    ) in flat(moves(named))


def test_the_same_ollama_in_this_network_namespace_is_proposed(
    incident: IncidentHost, fakenvml_path: Path, tmp_path: Path, other_port: int
) -> None:
    with other_host(tmp_path, other_port, own_network=False) as other:
        proc_root = proc_of_both(incident, other, tmp_path / "proc-both")
        files = run_dry(proc_root, fakenvml_path, tmp_path)
        cwd = os.readlink(f"/proc/{other.ollama}/cwd")

    name = f"ollama-{other_port}"
    assert consumers(files, tmp_path)[name] == f"0.0.0.0:{other_port}"  # its socket's address
    env_file = tmp_path / "proposal" / f"{name}.env"
    assert f"export OLLAMA_MODELS={OTHER_MODELS}" in files[f"{name}.env"]
    assert f"export OLLAMA_HOST=0.0.0.0:{other_port}" in files[f"{name}.env"]
    lines = moves(files).splitlines()
    at = lines.index(f"     kill {other.ollama}")
    start = f'cd {cwd} && env -i /bin/sh -c \'. "$0" && exec "$@"\' {env_file}'
    assert lines[at + 1].startswith(
        f"     {start} env OLLAMA_HOST=127.0.0.1:{other_port + 1} OLLAMA_KEEP_ALIVE=-1 "
    )
    assert lines[at + 2].startswith(f"   undo: {start} {sys.executable} -m gpugate_sim.ollama")
