"""The real runtimes the suite builds, each reached directly and through the gate.

`make bench` builds llama.cpp's llama-server and whisper.cpp's whisper-server for the CPU
as `make test` does (tests/llamaserver/build.sh, tests/whisper/build.sh). Here each runs
with a tiny model of random weights (tests/llamaserver/gguf_models.py,
tests/whisper/ggml_models.py): a single-model llama-server and a whisper-server, both as
process consumers the gate starts on the first request that needs them, on a simulated
card of their own (the CPU builds put nothing on it). The servers run with one thread on
the load generator's core; the gate, and a bare pass-through in front of each, on the
proxy's (bench/targets.py).
"""

from __future__ import annotations

import json
import subprocess
import textwrap
import urllib.request
from pathlib import Path

import attrs

from bench.runtime_rig import Paths, start_front, stop_all
from bench.targets import LOAD_CPU, bench_gpu, gate_env, wait_http
from tests.gate.harness import free_ports
from tests.llamaserver.conftest import BINARY as LLAMA_BINARY
from tests.llamaserver.gguf_models import write_tiny_llama
from tests.whisper.conftest import BINARY as WHISPER_BINARY
from tests.whisper.ggml_models import write_english

REAL = ("llama", "whisper")


def llama_argv(model: Path, port: int) -> list[str]:
    """One model, one thread, one slot, a small context: as the suite runs it."""
    return [str(LLAMA_BINARY), "-m", str(model), "--host", "127.0.0.1", "--port", str(port),
            "-t", "1", "-tb", "1", "-c", "512", "-np", "1"]  # fmt: skip


def whisper_argv(model: Path, port: int) -> list[str]:
    return [str(WHISPER_BINARY), "-m", str(model), "--host", "127.0.0.1", "--port", str(port),
            "-t", "1"]  # fmt: skip


def consumers_yaml(
    control: int, listen: dict[str, int], upstream: dict[str, int], argv: dict[str, list[str]]
) -> str:
    """The gate in front of both, each a process consumer it starts on demand."""
    pinned = {name: ["taskset", "-c", str(LOAD_CPU), *cmd] for name, cmd in argv.items()}
    return textwrap.dedent(f"""\
        gate:
          control: 127.0.0.1:{control}
          shutdown_grace: 2s
        budget:
          reserve: 1GiB
          reserve_max: 1GiB
        consumers:
          llama:
            runtime: llama-server
            listen: 127.0.0.1:{listen["llama"]}
            upstream: http://127.0.0.1:{upstream["llama"]}
            class: interactive
            envelope: 512MiB
            residency: {{policy: keep_warm, ttl: 60m}}
            processes: {{commands: ["llama-server"]}}
            control:
              command: {json.dumps(pinned["llama"])}
              start_timeout: 60s
              stop_timeout: 5s
          whisper:
            runtime: whisper
            listen: 127.0.0.1:{listen["whisper"]}
            upstream: http://127.0.0.1:{upstream["whisper"]}
            class: interactive
            envelope: 100MiB
            residency: {{policy: keep_warm, ttl: 60m}}
            processes: {{commands: ["whisper-server"]}}
            control:
              command: {json.dumps(pinned["whisper"])}
              start_timeout: 60s
              stop_timeout: 5s
        """)


@attrs.define
class RealRig:
    """The gate and, once a first request started them, its two real servers."""

    tmp: Path
    first: dict[str, tuple[str, bytes, str]]
    """Per runtime, a request that runs its model (path, body, content type): the gate
    starts each server on it."""
    processes: list[subprocess.Popen[bytes]] = attrs.field(factory=list)

    def start(self) -> Paths:
        """Start the gate and the bare pass-throughs, have the gate start both servers,
        and wait until each path answers."""
        for binary in (LLAMA_BINARY, WHISPER_BINARY):
            if not binary.exists():
                raise RuntimeError(f"{binary} is missing; run `make bench`")
        ports = free_ports(3 * len(REAL) + 1)
        upstream = dict(zip(REAL, ports[0:2], strict=True))
        listen = dict(zip(REAL, ports[2:4], strict=True))
        bare = dict(zip(REAL, ports[4:6], strict=True))
        control = ports[6]
        llama = write_tiny_llama(self.tmp / "tiny.gguf", seed=11)
        whisper = write_english(self.tmp / "ggml-tiny.en.bin", seed=1)
        argv = {
            "llama": llama_argv(llama, upstream["llama"]),
            "whisper": whisper_argv(whisper, upstream["whisper"]),
        }
        config = self.tmp / "consumers.yaml"
        config.write_text(consumers_yaml(control, listen, upstream, argv))
        gpu = bench_gpu(self.tmp / "gpu")
        ports = {"direct": upstream, "bare": bare, "gate": listen}
        env = gate_env(gpu)
        paths = start_front(self.processes, config, env, self.tmp / "gate.log", ports, control)
        # A request that runs the model starts each server (its /health would not).
        for name, (path, body, kind) in self.first.items():
            request = urllib.request.Request(
                paths.gate[name] + path, data=body, headers={"Content-Type": kind}
            )
            with urllib.request.urlopen(request, timeout=120) as resp:
                resp.read()
        for target in (paths.direct, paths.bare, paths.gate):
            for name in REAL:
                wait_http(target[name] + "/health")
        return paths

    def stop(self) -> None:
        """Stop the gate; it stops the servers it started."""
        stop_all(self.processes)
