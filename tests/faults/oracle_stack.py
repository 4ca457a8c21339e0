"""The gate in front of simulated runtimes that say what they acted on, for the oracle fuzzer.

Ollama's listener forwards to the Go oracle (tests/oracle/), which reads each request as
Ollama v0.24.0 does, records whether it could load a model, and passes it on to the
simulated Ollama, which records its own reading of the same bytes (oracle_compare.py).
The simulated ComfyUI records every prompt it queued or refused, read by its own aiohttp
server and its own validation; the simulated whisper-server (the gate's child, started
under a lease) every `/load` and `/inference` it answered.
"""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator
from pathlib import Path

import attrs

from tests.clihost import GateProcess, HostProcess, running_host
from tests.faults.oraclegen import WHISPER_MODELS
from tests.faults.stack import CLASSES, MODELS
from tests.oracle.oracle import start_oracle
from tests.ports import free_ports

COMFY_FILES = {"checkpoints": {"v1-5-pruned-emaonly-fp16.safetensors": 2034}}  # MiB


def host_yaml(ollama: int, comfy: int, prompts: Path, readings: Path) -> str:
    """A 16 GiB card with a Plex transcode, a simulated Ollama and ComfyUI, each recording
    what it read."""
    models = "".join(
        f"    - {{name: '{name}', size: {mib}MiB, load_seconds: 0.02, "
        f"embedding: {str(name == 'bge-m3').lower()}}}\n"
        for name, mib in MODELS.items()
    )
    files = "".join(
        f"    {folder}:\n" + "".join(f"      {name}: {mib}MiB\n" for name, mib in names.items())
        for folder, names in COMFY_FILES.items()
    )
    return (
        textwrap.dedent(f"""\
        gpus:
          - {{name: NVIDIA GeForce RTX 4080, total: 16GiB, reserved: 434MiB}}
        holders:
          - name: Plex Transcoder
            command: ["/usr/lib/plexmediaserver/Plex Transcoder", "-codec:0", "hevc"]
            bytes: 1536MiB
        ollama:
          listen: 127.0.0.1:{ollama}
          tokens_per_second: 2000
          keep_alive: 5m
          record: {readings}
          models:
        """)
        + models
        + textwrap.dedent(f"""\
        comfyui:
          listen: 127.0.0.1:{comfy}
          context: 210MiB
          steps_per_second: 200
          load_seconds_per_gib: 0.01s
          record: {prompts}
          models:
        """)
        + files
    )


def gate_yaml(ports: Ports, whispers: Path) -> str:
    models = "".join(
        f"      {name}: {{envelope: {mib}MiB, class: {CLASSES.get(name, 'interactive')}}}\n"
        for name, mib in MODELS.items()
    )
    files = "".join(
        f"      {name}: {mib}MiB\n" for names in COMFY_FILES.values() for name, mib in names.items()
    )
    return (
        textwrap.dedent(f"""\
        gate:
          control: 127.0.0.1:{ports.control}
          shutdown_grace: 2s
        budget:
          reserve: 1GiB
          reserve_max: 1GiB
          sample_interval: 100ms
          stale_after: 2s
          reclaim_timeout: 2s
        classes:
          interactive: {{max_wait: 3s}}
          background: {{max_wait: 3s}}
        identities:
          - {{name: ops, class: production, tokens: [ops-token]}}
        consumers:
          ollama:
            runtime: ollama
            listen: 127.0.0.1:{ports.ollama_listen}
            upstream: http://127.0.0.1:{ports.oracle}
            class: interactive
            queue_limit: 16
            residency: {{policy: keep_warm, ttl: 20s}}
            timeouts: {{connect: 1s, first_byte: 5s, idle: 2s, control: 2s}}
            processes: {{commands: ["ollama serve"]}}
            models:
        """)
        + models
        + textwrap.indent(
            textwrap.dedent(f"""\
            comfyui:
              runtime: comfyui
              listen: 127.0.0.1:{ports.comfy_listen}
              upstream: http://127.0.0.1:{ports.comfy}
              class: interactive
              queue_limit: 16
              residency: {{policy: keep_warm, ttl: 20s}}
              timeouts: {{connect: 1s, first_byte: 5s, idle: 2s, control: 2s}}
              processes: {{commands: ["ComfyUI/main.py"]}}
              working_set: 256MiB
              files:
            """),
            "  ",
        )
        + files
        + textwrap.indent(
            textwrap.dedent(f"""\
            whisper:
              runtime: whisper
              listen: 127.0.0.1:{ports.whisper_listen}
              upstream: http://127.0.0.1:{ports.whisper}
              class: interactive
              envelope: 2050MiB
              residency: {{policy: keep_warm, ttl: 20s}}
              timeouts: {{connect: 1s, first_byte: 5s, idle: 2s, control: 2s}}
              processes: {{commands: ["whisper-server"]}}
              control:
                command: [{sys.executable}, -m, gpugate_sim.whisper, -m, {WHISPER_MODELS[0]},
                          --host, 127.0.0.1, --port, "{ports.whisper}",
                          --sim-model-size, "{WHISPER_MODELS[0]}=2050MiB",
                          --sim-model-size, "{WHISPER_MODELS[1]}=200MiB",
                          --sim-load-seconds, "0.05", --sim-decode-per-audio-second, "0.001",
                          --sim-record, "{whispers}"]
                start_timeout: 20s
                start_admission_timeout: 3s
            """),
            "  ",
        )
        + textwrap.dedent("""\
        external:
          plex:
            processes: {commands: ["Plex Transcoder"]}
        """)
    )


@attrs.frozen
class Ports:
    ollama: int
    oracle: int
    ollama_listen: int
    comfy: int
    comfy_listen: int
    control: int
    whisper: int
    whisper_listen: int


@attrs.define
class OracleStack:
    """The simulated host, the oracle and the gate, and where each records."""

    directory: Path
    ports: Ports
    host: HostProcess
    gate: GateProcess
    oracle: subprocess.Popen[str]
    ollama_records: Path
    """The oracle's record of each request, as Ollama reads it."""
    ollama_readings: Path
    """The simulated Ollama's record of each request it read."""
    prompt_records: Path
    whisper_records: Path


@contextlib.asynccontextmanager
async def oracle_stack(directory: Path) -> AsyncIterator[OracleStack]:
    """Start the host, the oracle and the gate in `directory`; stop them after."""
    ports = Ports(*free_ports(8))
    prompts = directory / "prompts.jsonl"
    whispers = directory / "whisper.jsonl"
    loads = directory / "ollama.jsonl"
    readings = directory / "ollama-readings.jsonl"
    host_file = directory / "host.yaml"
    host_file.write_text(host_yaml(ports.ollama, ports.comfy, prompts, readings))
    config = directory / "consumers.yaml"
    config.write_text(gate_yaml(ports, whispers))
    with running_host(host_file, directory / "state", ports.ollama) as host:
        _, oracle = await asyncio.to_thread(
            start_oracle,
            f"http://127.0.0.1:{ports.ollama}",
            loads,
            listen=f"127.0.0.1:{ports.oracle}",
        )
        gate = GateProcess(
            config,
            host.env(),
            f"http://127.0.0.1:{ports.ollama_listen}",
            f"http://127.0.0.1:{ports.control}",
        )
        try:
            await asyncio.to_thread(gate.start)
            yield OracleStack(
                directory, ports, host, gate, oracle, loads, readings, prompts, whispers
            )
        finally:
            await asyncio.to_thread(gate.stop)
            oracle.terminate()
            await asyncio.to_thread(oracle.wait)
