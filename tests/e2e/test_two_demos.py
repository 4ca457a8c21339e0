"""Two `gpugate demo`s on one host, as two users (or one user twice, with `--port-base`)
run them: each gate has its own local token, so stopping one leaves the other's printed
operator commands working."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path

import aiohttp
import yaml

from gpugate.commands.demo import PORTS, demo_ports
from gpugate.commands.exits import Exit
from gpugate.commands.local_token import local_token_path
from tests.e2e.test_demo import poll
from tests.e2e.test_installed_demo import free_port_base, printed_commands, start_demo
from tests.sim.processes import LineReader, kill_quietly

ROOT = Path(__file__).resolve().parents[2]


class Demo:
    """One `gpugate demo --port-base N` and what it printed."""

    def __init__(self, base: int, env: dict[str, str]) -> None:
        self.ports = demo_ports(base)
        self.env = env
        self.process = start_demo(base, env=env)
        self.reader = LineReader(self.process.stdout)

    def started(self) -> None:
        self.reader.until("Events follow", timeout=180)

    def command(self, fragment: str) -> str:
        """The one shell command it printed that contains `fragment`."""
        [found] = [c for c in printed_commands(self.reader.seen) if fragment in c]
        return found

    @property
    def config(self) -> Path:
        return Path(self.command(" status --config ").split()[-1])

    async def run(self, command: str) -> tuple[int, str]:
        """A printed command, in a shell, as a reader pastes it."""
        done = await asyncio.to_thread(
            subprocess.run, ["bash", "-c", command], cwd=ROOT, env=self.env,
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        return done.returncode, done.stdout + done.stderr

    def stop(self) -> int:
        os.killpg(self.process.pid, signal.SIGINT)  # Ctrl-C in its terminal
        return self.process.wait(timeout=90)

    def kill(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
        kill_quietly(self.process)


def two_bases() -> tuple[int, int]:
    """Two port bases whose ranges do not overlap."""
    first = free_port_base()
    while abs((second := free_port_base()) - first) < len(PORTS):
        pass
    return first, second


async def test_two_demos_keep_their_own_tokens_and_one_stopping_leaves_the_other_working(
    tmp_path, monkeypatch
):
    # One user's runtime directory, shared by both demos (and read here too).
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path / "run"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUGATE_")}
    (tmp_path / "run").mkdir(mode=0o700)
    first, second = (Demo(base, env) for base in two_bases())
    try:
        first.started()
        second.started()
        tokens = []
        for demo in (first, second):
            named = yaml.safe_load(demo.config.read_text())["gate"]["control_tokens"]
            path = local_token_path(demo.ports["control"])
            assert str(path).startswith(str(tmp_path / "run"))
            assert named == [f"file:{path}"]
            tokens.append(path.read_text())
        assert tokens[0] != tokens[1], "each gate has a token of its own"

        assert first.stop() == 0
        assert not first.config.exists(), "the first's files went with it"
        assert not local_token_path(first.ports["control"]).exists(), "the first's went"
        assert local_token_path(second.ports["control"]).read_text() == tokens[1]

        # The second's operator commands, as it printed them, still present its token.
        control = f"http://127.0.0.1:{second.ports['control']}"
        async with aiohttp.ClientSession() as session:

            async def listed() -> bool | None:
                async with session.get(control + "/gate/v1/status") as resp:
                    models = {r["model"] for r in (await resp.json())["residents"]}
                return True if "bge-m3:latest" in models else None

            await poll(listed)
        code, out = await second.run(second.command(" evict ollama bge-m3 "))
        assert code == Exit.OK, out
        assert "evicting ollama/bge-m3" in out
        for action in ("pause", "resume"):
            code, out = await second.run(
                f"{sys.executable} -m gpugate {action} --gpu 0 --config {second.config}"
            )
            assert code == Exit.OK, out
        assert second.stop() == 0
        assert list((tmp_path / "run" / "gpugate").iterdir()) == []
    finally:
        first.kill()
        second.kill()
