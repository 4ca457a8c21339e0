"""Every command in the README's table, as printed, against `make run`: the demo on its own
ports, with no token in the environment (the demo's local token reaches them), each command
run three ways: from the checkout, where `./consumers.yaml` names the demo's control
address; from another directory in a shell where the `export GPUGATE_CONFIG=...` the demo
prints was typed; and from another directory with `--config` and the file the demo prints."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

from tests.sim.processes import LineReader, kill_quietly

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"

STARTED_BY_THE_TEST = {
    "serve": "what the demo runs",
    "demo": "what `make run` starts: the test runs it",
    "sim": "what the demo runs (`gpugate sim run`)",
    "init": "it reads the host, not the gate: tried on the simulated host in tests/init",
}
"""Commands of the table that are not run against the demo, and why."""

RUNS: list[tuple[str, list[str], int]] = [
    ("check", ["check"], 0),
    ("status", ["status"], 0),
    ("status", ["status", "--json"], 0),
    ("leases", ["leases"], 0),
    ("leases", ["leases", "--json"], 0),
    ("events", ["events"], 0),
    ("events", ["events", "--class", "interactive", "--json"], 0),
    ("envelopes", ["envelopes"], 0),
    ("evict", ["evict", "ollama", "bge-m3"], 0),
    ("drain", ["drain", "comfyui"], 0),
    ("undrain", ["undrain", "comfyui"], 0),
    ("pause", ["pause", "--gpu", "0"], 0),
    ("resume", ["resume", "--gpu", "0"], 0),
    ("lease", ["lease", "--consumer", "ollama", "--bytes", "256MiB", "--", "true"], 0),
    ("admit", ["admit", "whisper", "--wait", "30s"], 0),
    ("share", ["share", "--list"], 0),
    ("share", ["share", "systemd/gpugate.service"], 0),
]
"""(command, arguments, exit status) as the README prints them."""

FOLLOWED = [["status", "--watch"], ["events", "--follow"]]
"""Commands that run until Ctrl-C: each must print, then end on SIGINT."""


def readme_commands() -> set[str]:
    """The subcommands the README's command table names (`gpugate X ...` and `/ X ...`)."""
    table = README.read_text().split("## Commands", 1)[1].split("\n\n", 2)[1]
    names: set[str] = set()
    for row in table.splitlines()[2:]:
        first = row.split("|")[1]
        names.update(re.findall(r"`gpugate (\w+)", first))
        names.update(re.findall(r"/ `?(\w+) ", first))
    return names


def gpugate(args: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpugate", *args],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=90,
    )  # fmt: skip


def with_config(args: list[str], config: str) -> list[str]:
    """`args` with `--config FILE` (before a `-- CMD`; `check` takes the file itself; `share`
    reads no configuration, so it is run as printed)."""
    if args[0] == "check":
        return [*args, config]
    if args[0] == "share":
        return args
    at = args.index("--") if "--" in args else len(args)
    return [*args[:at], "--config", config, *args[at:]]


def bge_m3_loaded() -> None:
    """Load bge-m3 again through the gate (an earlier way evicted it): each way evicts it."""
    request = urllib.request.Request(
        "http://127.0.0.1:11434/api/embed",
        data=json.dumps({"model": "bge-m3", "input": "hello"}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=120) as answer:
        assert answer.status == 200


def test_the_table_is_what_this_test_runs():
    covered = {name for name, _, _ in RUNS} | {args[0] for args in FOLLOWED}
    assert readme_commands() == covered | set(STARTED_BY_THE_TEST)


def test_every_readme_command_works_as_printed_against_make_run(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUGATE_")}
    demo = subprocess.Popen(
        [sys.executable, "-m", "gpugate", "demo"],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    try:
        assert demo.stdout is not None
        reader = LineReader(demo.stdout)
        reader.until("Events follow", timeout=90)
        (export,) = [line for line in reader.seen if line.strip().startswith("export ")]
        name, _, config = shlex.split(export)[1].partition("=")
        assert name == "GPUGATE_CONFIG" and Path(config).is_file()
        elsewhere = tmp_path / "elsewhere"
        elsewhere.mkdir()
        ways = {
            "from the checkout": (ROOT, env, lambda args: args),
            "with the demo's export": (elsewhere, {**env, name: config}, lambda args: args),
            "with --config": (elsewhere, env, lambda args: with_config(args, config)),
        }
        failed = []
        for way, (cwd, way_env, form) in ways.items():
            bge_m3_loaded()
            for command, args, status in RUNS:
                done = gpugate(form(args), way_env, cwd)
                if done.returncode != status:
                    failed.append((way, args, done.returncode, done.stderr.strip()[-300:]))
                elif not done.stdout.strip() and command not in ("lease", "admit"):
                    failed.append((way, args, "printed nothing", done.stderr.strip()[-300:]))
            for args in FOLLOWED:
                child = subprocess.Popen(
                    [sys.executable, "-m", "gpugate", *form(args)],
                    cwd=cwd, env=way_env, stdout=subprocess.PIPE, text=True,
                )  # fmt: skip
                try:
                    assert child.stdout is not None
                    first = LineReader(child.stdout).next(timeout=30)
                    assert first, (way, args)
                    child.send_signal(signal.SIGINT)
                    assert child.wait(timeout=30) in (0, 130), (way, args)
                finally:
                    kill_quietly(child)
        assert failed == []
    finally:
        if demo.poll() is None:
            os.killpg(demo.pid, signal.SIGTERM)
            demo.wait(timeout=60)
        kill_quietly(demo)
