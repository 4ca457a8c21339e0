"""A runtime started by hand, moved as `gpugate init` says and moved back by its undo: the
commands it prints are run for real, and the runtime they start has the environment and the
working directory it had.

The runtime is a stand-in whisper-server (a script of that name, run by the interpreter as
a real one would be by its shebang) that listens where its options say and reports its
environment, working directory and address on stdout.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpugate.cli import main
from gpugate.init.write import split_dry_run
from gpugate_sim.device import SimulatedGpuHost
from tests.init.simhost import port_pairs, restricted_proc
from tests.sim.processes import LineReader

SECRET = "hf_live_not_to_be_printed"
SHELL_OWN = {"PWD", "SHLVL", "_"}
"""What the shell that reads the environment file adds of its own (dash: PWD; bash also
SHLVL and _)."""

STAND_IN = """\
import json, os, socket, sys, time
args = sys.argv[1:]
host = args[args.index("--host") + 1] if "--host" in args else "127.0.0.1"
port = int(args[args.index("--port") + 1])
sock = socket.socket()
sock.bind((host, port))
sock.listen()
print(json.dumps({"env": dict(os.environ), "cwd": os.getcwd(),
                  "address": f"{host}:{port}", "model": os.path.getsize(args[1])}), flush=True)
time.sleep(3600)
"""


class Running:
    """The processes a test started, each stopped at the end."""

    def __init__(self) -> None:
        self.started: list[subprocess.Popen[str]] = []

    def start(self, argv: list[str], **kwargs: Any) -> tuple[subprocess.Popen[str], dict]:
        """Start `argv` in a process group of its own, wait for its report."""
        popen = subprocess.Popen(
            argv, stdout=subprocess.PIPE, text=True, start_new_session=True, **kwargs
        )
        self.started.append(popen)
        assert popen.stdout is not None
        line = LineReader(popen.stdout).next(timeout=60)
        assert line, f"{argv} reported nothing"
        return popen, json.loads(line)

    def shell(self, command: str) -> tuple[subprocess.Popen[str], dict]:
        """A command as an operator types it, in a shell of its own."""
        return self.start(["/bin/sh", "-c", command])

    def stop(self, popen: subprocess.Popen[str]) -> None:
        """Stop it and whatever it started, and reap it."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(popen.pid, signal.SIGTERM)
        popen.wait(timeout=30)

    def close(self) -> None:
        for popen in self.started:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(popen.pid, signal.SIGKILL)
            popen.wait(timeout=30)


@pytest.fixture
def running() -> Iterator[Running]:
    started = Running()
    try:
        yield started
    finally:
        started.close()


def test_a_runtime_started_by_hand_comes_back_with_its_environment_and_directory(
    tmp_path: Path, running: Running, sim_host: SimulatedGpuHost, fakenvml_path: Path
) -> None:
    (port,) = port_pairs(1)
    program = tmp_path / "bin" / "whisper-server"
    program.parent.mkdir()
    program.write_text(STAND_IN)
    program.chmod(program.stat().st_mode | stat.S_IXUSR)
    work = tmp_path / "work dir"
    (work / "models").mkdir(parents=True)
    with open(work / "models" / "ggml-base.bin", "wb") as fh:
        fh.truncate(147 * 1024 * 1024)
    env = {
        "PATH": os.environ["PATH"],
        "HOME": str(tmp_path / "home"),
        "LANG": "C.UTF-8",  # else Python sets LC_CTYPE in its own environment
        "HF_TOKEN": SECRET,
        "CUDA_VISIBLE_DEVICES": "0",
        "WHISPER_NOTE": "a b 'quoted' $HOME \\ done",
    }
    argv = [sys.executable, str(program), "-m", "models/ggml-base.bin",
            "--host", "0.0.0.0", "--port", str(port)]  # fmt: skip
    original, report = running.start(argv, cwd=work, env=env)
    assert report == {"env": env, "cwd": str(work), "address": f"0.0.0.0:{port}",
                      "model": 147 * 1024 * 1024}  # fmt: skip
    proc_root = restricted_proc(tmp_path / "proc", {original.pid: original.pid},
                                {original.pid: "by hand"})  # fmt: skip
    out = tmp_path / "proposal"
    options = ["--proc-root", str(proc_root), "--nvml-library", str(fakenvml_path), "--no-ask"]

    shown = io.StringIO()
    with contextlib.redirect_stdout(shown):
        assert main(["init", "--dry-run", "--out", str(out), *options]) == 0
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert main(["init", "--out", str(out), *options]) == 0

    # The secret is in the file the command reads, never on the terminal.
    assert SECRET not in shown.getvalue() and SECRET not in printed.getvalue()
    assert "export HF_TOKEN='***'" in split_dry_run(shown.getvalue())["whisper.env"]
    env_file = out / "whisper.env"
    assert stat.S_IMODE(env_file.stat().st_mode) == 0o600
    assert f"export HF_TOKEN={SECRET}" in env_file.read_text()

    lines = (out / "moves.txt").read_text().splitlines()
    at = lines.index(f"     kill {original.pid}")
    move, undo = lines[at + 1].strip(), lines[at + 2]
    assert undo.startswith("   undo: ")

    running.stop(original)
    moved, report = running.shell(move)
    assert report["address"] == f"127.0.0.1:{port + 1}"
    assert report["cwd"] == str(work)
    assert report["model"] == 147 * 1024 * 1024  # its relative -m, found from there
    assert {k: v for k, v in report["env"].items() if k not in SHELL_OWN} == env

    running.stop(moved)
    back, report = running.shell(undo.removeprefix("   undo: "))
    assert report["address"] == f"0.0.0.0:{port}"
    assert report["cwd"] == str(work)
    assert {k: v for k, v in report["env"].items() if k not in SHELL_OWN} == env
    running.stop(back)
