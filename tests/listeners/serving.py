"""`gpugate serve` as a child process on the simulated host, in front of a simulated Ollama."""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import attrs

from tests.sim.processes import LineReader


@attrs.define
class Served:
    process: subprocess.Popen[str]
    stdout: LineReader
    stderr: LineReader

    def stderr_lines(self) -> list[str]:
        """Every stderr line so far, waiting for the rest once the process has exited."""
        while self.process.poll() is not None and self.stderr.next() is not None:
            pass
        return list(self.stderr.seen)


def consumers_yaml(control: int, listen: int, upstream: str, *, reserve: str, more: str) -> str:
    return f"""\
gate:
  control: 127.0.0.1:{control}
  shutdown_grace: 1s
budget:
  reserve: {reserve}
  reserve_max: {reserve}
  sample_interval: 100ms
consumers:
  ollama:
    runtime: ollama
    listen: 127.0.0.1:{listen}
    upstream: {upstream}
    processes: {{commands: ["ollama serve"]}}
{more}"""


@contextlib.contextmanager
def serving(
    config: Path, env: dict[str, str], preexec_fn: Callable[[], None] | None = None
) -> Iterator[Served]:
    process = subprocess.Popen(
        [sys.executable, "-m", "gpugate", "serve", "--config", str(config)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=preexec_fn,
    )
    served = Served(process, LineReader(process.stdout), LineReader(process.stderr))
    try:
        served.stdout.until("gpugate: ready")
        yield served
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            process.wait(timeout=30)
