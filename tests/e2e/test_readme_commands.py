"""Every command in the README's table, as printed, against `make run`: the demo on its own
ports, the commands run from the checkout (where `./consumers.yaml` names the demo's
control address) with no token in the environment: the demo's local token reaches them."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
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
    ("check", ["check", "consumers.yaml"], 0),
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


def gpugate(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpugate", *args],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=90,
    )  # fmt: skip


def test_the_table_is_what_this_test_runs():
    covered = {name for name, _, _ in RUNS} | {args[0] for args in FOLLOWED}
    assert readme_commands() == covered | set(STARTED_BY_THE_TEST)


def test_every_readme_command_works_as_printed_against_make_run():
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUGATE_")}
    demo = subprocess.Popen(
        [sys.executable, "-m", "gpugate", "demo"],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    try:
        assert demo.stdout is not None
        LineReader(demo.stdout).until("Events follow", timeout=90)
        failed = []
        for name, args, status in RUNS:
            done = gpugate(args, env)
            if done.returncode != status:
                failed.append((name, args, done.returncode, done.stderr.strip()[-300:]))
            elif not done.stdout.strip() and name not in ("lease", "admit"):
                failed.append((name, args, "printed nothing", done.stderr.strip()[-300:]))
        assert failed == []
        for args in FOLLOWED:
            child = subprocess.Popen(
                [sys.executable, "-m", "gpugate", *args],
                cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True,
            )  # fmt: skip
            try:
                assert child.stdout is not None
                first = LineReader(child.stdout).next(timeout=30)
                assert first, args
                child.send_signal(signal.SIGINT)
                assert child.wait(timeout=30) in (0, 130), args
            finally:
                kill_quietly(child)
    finally:
        if demo.poll() is None:
            os.killpg(demo.pid, signal.SIGTERM)
            demo.wait(timeout=60)
        kill_quietly(demo)
