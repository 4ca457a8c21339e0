"""`gpugate demo` from an installed wheel, on ports moved with `--port-base`.

The wheel is built from the package's own files (`pip wheel --no-deps`) and installed into
a fresh venv. Its dependencies come from this test's environment through a `.pth` line
added after the install; gpugate and its simulator (gpugate_sim) come only from the wheel
(the checkout is never on that venv's path). The demo runs from a directory that is not
the checkout, with an empty user cache, so the installed package finds its data files and
builds its fake NVML library on its own. Its printed commands then run, as printed, from
another directory.

The fast tests check what `--port-base` does to the demo's files without starting it.
"""

from __future__ import annotations

import os
import random
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import time
import zipfile
from pathlib import Path

import pytest
import yaml

from gpugate.commands.demo import (
    DEFAULT_CONFIG,
    DEFAULT_HOST,
    FLUX_PROMPT,
    PORTS,
    demo_ports,
    how_to,
    prepare,
    run_demo,
)
from gpugate.runtimes.sections import load_config
from tests.sim.processes import LineReader, kill_quietly

ROOT = Path(__file__).resolve().parents[2]
DEFAULTS = {port for _, port in PORTS}
COMMAND_STARTS = ("curl ", "OLLAMA_HOST=", "/")
"""How the demo's printed commands begin (gpugate itself is printed as an absolute path)."""


def free_port_base(count: int = len(PORTS)) -> int:
    """A base N with N..N+count-1 free on loopback, outside the kernel's ephemeral range."""
    low, high = map(int, Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    ranges = [r for r in ((high + 1, 65535), (20000, low - 1)) if r[1] - r[0] > 10 * count]
    lo, hi = ranges[0]
    for _ in range(200):
        start = random.randrange(lo, hi - count)
        if all(_bindable(start + i) for i in range(count)):
            return start
    raise AssertionError(f"no {count} free ports in {lo}..{hi}")


def start_demo(base: int, *flags: str, **popen: object) -> subprocess.Popen[str]:
    """`gpugate demo --port-base BASE [FLAGS]` from the checkout, in a session of its own
    (stopped by its group), its standard output a pipe; `popen`: more for Popen."""
    return subprocess.Popen(  # type: ignore[call-overload, no-any-return]
        [sys.executable, "-m", "gpugate", "demo", *flags, "--port-base", str(base)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
        **popen,
    )


def _bindable(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def ports_in(text: str) -> set[int]:
    """Every port named as 127.0.0.1:PORT or `--port PORT` in `text`."""
    found = {int(p) for p in re.findall(r"127\.0\.0\.1:(\d+)", text)}
    found |= {int(p) for p in re.findall(r"--port\W+(\d+)", text)}
    return found


def printed_commands(lines: list[str]) -> list[str]:
    """The shell commands among the demo's printed lines (a trailing backslash continues)."""
    commands: list[str] = []
    joined = ""
    for line in lines:
        if joined:
            joined += " " + line.strip()
        elif line.startswith("  ") and line.strip().startswith(COMMAND_STARTS):
            joined = line.strip()
        else:
            continue
        if joined.endswith("\\"):
            joined = joined[:-1].rstrip()
            continue
        commands.append(joined)
        joined = ""
    return commands


# -- without starting it -------------------------------------------------------------------------


def test_without_a_port_base_the_demo_keeps_the_ports_its_clients_expect(tmp_path: Path):
    ports = demo_ports()
    assert ports["ollama"] == 11434 and ports["comfyui"] == 8188 and ports["control"] == 9411
    files = prepare(tmp_path, DEFAULT_HOST, DEFAULT_CONFIG, ports, tmp_path / "token")
    config = load_config(files["config"])
    listening = {c.name: c.listen.port for c in config.consumers}
    assert listening == {"ollama": 11434, "comfyui": 8188, "whisper": 8080, "mvoice": 7860}
    assert config.gate.control.port == 9411


def test_a_port_base_moves_every_port_of_the_demo(tmp_path: Path):
    base = 47000
    ports = demo_ports(base)
    assert list(ports.values()) == list(range(base, base + len(PORTS)))
    files = prepare(tmp_path, DEFAULT_HOST, DEFAULT_CONFIG, ports, tmp_path / "token")
    moved = range(base, base + len(PORTS))
    for name in ("config", "host"):
        text = files[name].read_text()
        # (The host's mVoice shows `--port 8765` in its command line; it listens nowhere.)
        assert ports_in(text) - {8765} <= set(moved), (name, ports_in(text))
        stray = {int(n) for n in re.findall(r"\b\d+\b", text)} & DEFAULTS
        assert not stray, f"a default port is left in the demo's {name}: {stray}"
    config = load_config(files["config"])
    by_name = {c.name: c for c in config.consumers}
    for consumer in ("ollama", "comfyui", "whisper", "mvoice"):
        assert by_name[consumer].listen.port == ports[consumer]
        assert by_name[consumer].upstream.port == ports[f"{consumer}_upstream"]
    assert config.gate.control.port == ports["control"]
    host = yaml.safe_load(files["host"].read_text())
    assert host["ollama"]["listen"] == f"127.0.0.1:{ports['ollama_upstream']}"
    assert host["comfyui"]["listen"] == f"127.0.0.1:{ports['comfyui_upstream']}"
    assert "whisper" not in host, "the gate runs the whisper-server"
    whisper = by_name["whisper"].control
    assert whisper is not None
    argv = list(whisper.command)
    assert argv[argv.index("--port") + 1] == str(ports["whisper_upstream"])


def test_the_printed_commands_name_the_ports_and_absolute_paths(tmp_path: Path):
    ports = demo_ports(52000)
    files = prepare(tmp_path, DEFAULT_HOST, DEFAULT_CONFIG, ports, tmp_path / "token")
    text = how_to(ports, tmp_path, files)
    assert ports_in(text) <= set(ports.values())
    assert {ports["ollama"], ports["comfyui"], ports["whisper"], ports["control"]} <= ports_in(text)
    commands = printed_commands(text.splitlines())
    assert commands, text
    for command in commands:
        for word in shlex.split(command, comments=True):
            path = word.split("@", 1)[1] if "@" in word else word
            if "/" in path and "://" not in path and not path.startswith("http"):
                assert Path(path).is_absolute() and Path(path).exists(), (word, command)
    assert (tmp_path / "flux-prompt.json").read_bytes() == FLUX_PROMPT.read_bytes()


def test_a_port_base_out_of_range_or_a_port_in_use_starts_nothing(capsys):
    assert run_demo(port_base=65530) == 64
    assert "--port-base" in capsys.readouterr().err
    base = free_port_base()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", base + 8))
        taken.listen()
        assert run_demo(port_base=base) == 1
    err = capsys.readouterr().err
    assert f"127.0.0.1:{base + 8} (control)" in err, err


# -- installed -----------------------------------------------------------------------------------


def build_wheel(tmp_path: Path) -> Path:
    """`pip wheel --no-deps` of the package's own files, copied out of the checkout (so the
    build leaves nothing in it)."""
    source = tmp_path / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    for package in ("gpugate", "gpugate_sim"):
        shutil.copytree(
            ROOT / package, source / package, ignore=shutil.ignore_patterns("__pycache__")
        )
    wheels = tmp_path / "wheels"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", str(wheels),
         str(source)],
        check=True,
        timeout=300,
    )  # fmt: skip
    [wheel] = wheels.glob("gpugate-*.whl")
    return wheel


def install(wheel: Path, venv: Path) -> Path:
    """A fresh venv holding the wheel; its dependencies are this environment's. Its python."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet",
         "--no-deps", "--no-index", str(wheel)],
        check=True,
        timeout=300,
    )  # fmt: skip
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    here = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    (Path(site) / "gpugate-test-deps.pth").write_text("\n".join(sorted(here)) + "\n")
    return python


def descendants(pid: int) -> set[int]:
    """Every live process below `pid`, from /proc."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry.name))
    found: set[int] = set()
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def alive(pid: int) -> bool:
    """A process that has not exited (a zombie has)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.e2e
def test_the_installed_demo_runs_beside_a_real_ollama_and_its_commands_work_anywhere(
    tmp_path: Path,
):
    started = time.monotonic()
    wheel = build_wheel(tmp_path)
    with zipfile.ZipFile(wheel) as packed:
        names = set(packed.namelist())
    for data in (DEFAULT_HOST, DEFAULT_CONFIG, FLUX_PROMPT):
        assert f"gpugate_sim/data/{data.name}" in names, sorted(names)
    assert "gpugate_sim/fakenvml.c" in names
    venv = tmp_path / "venv"
    python = install(wheel, venv)
    script = "import gpugate, gpugate_sim; print(gpugate.__file__, gpugate_sim.__file__)"
    where = subprocess.run(
        [str(python), "-c", script],
        capture_output=True, text=True, check=True, cwd=tmp_path,
    ).stdout.split()  # fmt: skip
    assert len(where) == 2, where
    for package in where:
        assert Path(package).is_relative_to(venv), f"{package} imported, not the wheel's"

    base = free_port_base()
    ports = demo_ports(base)
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("PYTHONPATH", "VIRTUAL_ENV", "GPUGATE_FAKENVML", "GPUGATE_CONFIG")
        and k not in ("GPUGATE_TOKEN", "OLLAMA_HOST")
    }
    env["XDG_CACHE_HOME"] = str(tmp_path / "cache")  # the fake NVML library is built here
    env["XDG_RUNTIME_DIR"] = str(tmp_path / "run")  # the local token goes here
    (tmp_path / "run").mkdir(mode=0o700)
    elsewhere, other = tmp_path / "elsewhere", tmp_path / "other"
    elsewhere.mkdir()
    other.mkdir()
    errors = (tmp_path / "demo.err").open("w")
    demo = subprocess.Popen(
        [str(venv / "bin" / "gpugate"), "demo", "--port-base", str(base)],
        cwd=elsewhere,
        env=env,
        stdout=subprocess.PIPE,
        stderr=errors,
        text=True,
        start_new_session=True,
    )
    try:
        reader = LineReader(demo.stdout)
        try:
            reader.until("Events follow", timeout=180)
        except AssertionError:
            raise AssertionError((tmp_path / "demo.err").read_text()) from None
        printed = reader.seen
        assert ports_in("\n".join(printed)) <= set(ports.values()), printed
        assert (tmp_path / "cache" / "gpugate" / "fakenvml" / "libnvidia-ml.so.1").exists()
        commands = printed_commands(printed)

        def run(fragment: str) -> str:
            [command] = [c for c in commands if fragment in c]
            done = subprocess.run(
                ["bash", "-c", command], cwd=other, env=env, capture_output=True, text=True,
                timeout=120,
            )  # fmt: skip
            assert done.returncode == 0, (command, done.stdout, done.stderr)
            return done.stdout

        assert "schedulable" in run(" status --config ")
        assert "evicting ollama/bge-m3" in run(" evict ollama bge-m3 ")
        generated = run("/api/generate")
        assert '"done":true' in generated.replace(" ", ""), generated
        if any("OLLAMA_HOST=" in c for c in commands):
            assert run("OLLAMA_HOST=").strip()
        assert "qwen2.5:7b" in run("/api/ps")
        assert '"text"' in run("/inference")
        assert run("/history").strip().startswith("{")
        # The FLUX render through the gate is tests/e2e/test_demo.py's; here its prompt file,
        # as printed, is the packaged one.
        [queue] = [c for c in commands if "/prompt -d @" in c]
        prompt = Path(shlex.split(queue)[-1].removeprefix("@"))
        assert prompt.read_bytes() == FLUX_PROMPT.read_bytes()

        below = descendants(demo.pid)
        assert below, "the demo runs the simulated host and the gate as its children"
        os.killpg(demo.pid, signal.SIGINT)  # Ctrl-C in the demo's terminal
        assert demo.wait(timeout=90) == 0
        left = [pid for pid in below if alive(pid)]
        assert not left, f"left running after the demo stopped: {left}"
        assert not prompt.parent.exists(), "the demo's files went with it"
        token = tmp_path / "run" / "gpugate" / f"control-{ports['control']}.token"
        assert not token.exists(), "its gate's token went with it"
    finally:
        if demo.poll() is None:
            os.killpg(demo.pid, signal.SIGTERM)
        kill_quietly(demo)
        errors.close()
    print(f"installed demo: {time.monotonic() - started:.1f}s")
