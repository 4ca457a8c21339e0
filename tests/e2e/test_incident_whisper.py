"""The incident of 2026-07-29, through the CLI: a model loaded while whisper-server restarts.

The host is a copy of gpugate_sim/data/incident-2026-07-10.yaml on free ports, with
gemma3:12b at the size of the load that day (11,600 MiB with its context) and not preloaded:
the client loads it. whisper-server is a systemd unit here as on the real host; there is no
systemd, so a fake `systemctl` first on PATH (tests/e2e/fake_systemctl.py) runs the unit: its
ExecStartPre (`gpugate admit whisper`, from the drop-in) and then the simulated
whisper-server. The gate drives the same `systemctl` to start and stop it, so the unit
path, and the admit of a start the gate runs itself, are what is tested.

Direct (no gate) the restart aborts whisper (SIGABRT, an OOM on the simulated card).
Through the gate the load and the start are admitted against one budget: no OOM.
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import signal
import subprocess
import sys
import textwrap
import wave
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import attrs
import pytest
import yaml

from gpugate_sim.device import SimulatedGpuHost
from gpugate_sim.hostprocess import SimulatedHostProcess
from gpugate_sim.serverprocess import child_env
from gpugate_sim.whisper import SimWhisper, WhisperServerSpec, whisper_argv
from tests.ports import free_ports
from tests.sim.processes import LineReader

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
INCIDENT = ROOT / "gpugate_sim" / "data" / "incident-2026-07-10.yaml"
TOKEN = "incident-token"
UNIT = "whisper-server.service"
GEMMA_MIB = 11600
BGE_MIB = 2012
"""bge-m3's runner as it was that day (its shape alone makes it 1,617 MiB today)."""


def incident_host(ports: dict[str, int]) -> tuple[dict, WhisperServerSpec]:
    """The incident card on free ports; whisper-server taken out (its unit runs it)."""
    host = yaml.safe_load(INCIDENT.read_text())
    host["ollama"]["listen"] = f"127.0.0.1:{ports['ollama']}"
    host["comfyui"]["listen"] = f"127.0.0.1:{ports['comfyui']}"
    for model in host["ollama"]["models"]:
        if model["name"] == "gemma3:12b":
            model["size"] = f"{GEMMA_MIB}MiB"
            model["load_seconds"] = "1s"
        if model["name"] == "bge-m3":
            model["size"] = f"{BGE_MIB}MiB"
    host["ollama"]["preload"] = [p for p in host["ollama"]["preload"] if p["model"] == "bge-m3"]
    whisper = host.pop("whisper")
    spec = WhisperServerSpec(
        listen=f"127.0.0.1:{ports['whisper']}",
        model=whisper["model"],
        models={k: int(v.removesuffix("MiB")) * 2**20 for k, v in whisper["models"].items()},
        load_seconds=0.5,
        decode_per_audio_second=0.05,
    )
    return host, spec


def consumers(ports: dict[str, int]) -> str:
    return textwrap.dedent(f"""\
        gate:
          control: 127.0.0.1:{ports["control"]}
          shutdown_grace: 2s
          control_tokens: [env:GPUGATE_CONTROL_TOKEN]
        budget:
          reserve: 1GiB
          reserve_max: 1GiB
          sample_interval: 100ms
          reclaim_timeout: 10s
        consumers:
          ollama:
            runtime: ollama
            listen: 127.0.0.1:{ports["listen"]}
            upstream: http://127.0.0.1:{ports["ollama"]}
            class: interactive
            residency: {{policy: keep_warm, ttl: 15m}}
            processes: {{commands: ["ollama serve"]}}
            models:
              gemma3:12b: {{envelope: {GEMMA_MIB}MiB}}
              bge-m3: {{class: background, envelope: 2012MiB}}
          comfyui:
            runtime: comfyui
            listen: 127.0.0.1:{ports["comfyui_listen"]}
            upstream: http://127.0.0.1:{ports["comfyui"]}
            processes: {{commands: ["ComfyUI/main.py"]}}
          whisper:
            runtime: whisper
            listen: 127.0.0.1:{ports["whisper_listen"]}
            upstream: http://127.0.0.1:{ports["whisper"]}
            class: interactive
            envelope: 2050MiB
            processes: {{commands: ["whisper-server"]}}
            models:
              # The model its unit starts with; quick to reload, so the first to stop.
              models/ggml-large-v3-turbo.bin: {{reload_seconds: 500ms}}
            control:
              unit: {UNIT}
              start_timeout: 30s
              start_admission_timeout: 30s
          mvoice:
            runtime: http
            listen: 127.0.0.1:{ports["mvoice_listen"]}
            upstream: http://127.0.0.1:{ports["mvoice"]}
            envelope: 292MiB
            class: production
            residency: {{policy: always_warm}}
            processes: {{commands: ["mvoice"]}}
        """)


def wav(seconds: float = 2.0) -> bytes:
    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(16000)
        w.writeframes(b"\0\0" * int(16000 * seconds))
    return out.getvalue()


@attrs.define
class Incident:
    tmp: Path
    ports: dict[str, int]
    spec: WhisperServerSpec
    gpu: SimulatedGpuHost
    env: dict[str, str]
    config: Path

    @property
    def gate(self) -> str:
        return f"http://127.0.0.1:{self.ports['listen']}"

    @property
    def whisper(self) -> str:
        return f"http://127.0.0.1:{self.ports['whisper_listen']}"

    @property
    def control(self) -> str:
        return f"http://127.0.0.1:{self.ports['control']}"

    async def systemctl(self, verb: str) -> int:
        done = await asyncio.to_thread(
            subprocess.run, ["systemctl", verb, UNIT], env=self.env, capture_output=True
        )
        return done.returncode

    def unit_log(self) -> str:
        return (self.tmp / "systemd" / f"{UNIT}.log").read_text()

    async def status(self) -> dict:
        async with aiohttp.ClientSession() as s, s.get(self.control + "/gate/v1/status") as r:
            return await r.json()

    async def events(self) -> list[dict]:
        async with aiohttp.ClientSession() as s, s.get(self.control + "/gate/v1/events") as r:
            return [json.loads(x) for x in (await r.text()).splitlines() if x.strip()]


def systemd_dir(tmp: Path, spec: WhisperServerSpec, state: Path, config: Path) -> Path:
    """The fake `systemctl` first on PATH, and the unit with the gpugate drop-in."""
    bin_dir = tmp / "bin"
    bin_dir.mkdir()
    script = bin_dir / "systemctl"
    script.write_text(f'#!/bin/sh\nexec {sys.executable} -m tests.e2e.fake_systemctl "$@"\n')
    script.chmod(0o755)
    units = tmp / "systemd"
    units.mkdir()
    admit = [sys.executable, "-m", "gpugate", "admit", "whisper", "--wait", "60s"]
    unit = {"pre": [[*admit, "--config", str(config)]], "exec": whisper_argv(spec, state)}
    (units / f"{UNIT}.json").write_text(json.dumps(unit))
    return bin_dir


@pytest.fixture
def incident(tmp_path: Path) -> Iterator[Incident]:
    names = ("ollama", "comfyui", "whisper", "mvoice", "listen", "comfyui_listen",
             "whisper_listen", "mvoice_listen", "control")  # fmt: skip
    ports = dict(zip(names, free_ports(len(names)), strict=True))
    host, spec = incident_host(ports)
    host_file = tmp_path / "host.yaml"
    host_file.write_text(yaml.safe_dump(host))
    config = tmp_path / "consumers.yaml"
    config.write_text(consumers(ports))
    state = tmp_path / "state"
    with SimulatedHostProcess(host_file, state) as sim:
        assert sim.environment is not None
        bin_dir = systemd_dir(tmp_path, spec, state, config)
        env = child_env(
            {
                **sim.environment.apply(),
                "GPUGATE_CONTROL_TOKEN": TOKEN,
                "FAKE_SYSTEMD_DIR": str(tmp_path / "systemd"),
                "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
            }
        )
        env.pop("GPUGATE_TOKEN", None)
        yield Incident(tmp_path, ports, spec, SimulatedGpuHost(state), env, config)
        subprocess.run(["systemctl", "stop", UNIT], env=env, check=False)


async def load_gemma(url: str) -> int:
    body = {"model": "gemma3:12b", "prompt": "summarise the meeting", "stream": False}
    async with aiohttp.ClientSession() as s, s.post(url + "/api/generate", json=body) as r:
        await r.read()
        return r.status


async def transcribe(url: str) -> tuple[int, str]:
    form = aiohttp.FormData()
    form.add_field("file", wav(), filename="meeting.wav", content_type="audio/wav")
    async with aiohttp.ClientSession() as s, s.post(url + "/inference", data=form) as r:
        return r.status, await r.text()


async def test_direct_the_restart_aborts_whisper_with_an_oom(incident):
    """The incident as it happened: gemma3:12b loads while whisper-server is stopped; its
    start finds no room and aborts (systemd would restart it into the same abort)."""
    whisper = SimWhisper(incident.spec, incident.gpu.directory)
    whisper.start()
    whisper.stop()
    assert await load_gemma(f"http://127.0.0.1:{incident.ports['ollama']}") == 200
    whisper.spawn()
    with pytest.raises(Exception, match="exited with -6"):
        whisper.wait_serving(timeout=30)
    assert whisper.returncode == -signal.SIGABRT
    (oom,) = incident.gpu.ooms()
    assert oom.name == "whisper-server"


async def test_through_the_gate_the_restart_and_the_load_never_collide(incident):
    gate = subprocess.Popen(
        [sys.executable, "-m", "gpugate", "serve", "--config", str(incident.config)],
        env=incident.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    LineReader(gate.stderr)
    try:
        LineReader(gate.stdout).until("gpugate: ready")
        # whisper-server runs, started by its unit (its admit first).
        assert await incident.systemctl("start") == 0
        assert (await transcribe(incident.whisper))[0] == 200

        # The restart while a client loads gemma3:12b at the gate's Ollama port.
        assert await incident.systemctl("stop") == 0
        loaded, started = await asyncio.gather(
            load_gemma(incident.gate), incident.systemctl("start")
        )
        assert (loaded, started) == (200, 0)
        status, text = await transcribe(incident.whisper)
        assert status == 200, text
        assert incident.gpu.ooms() == [], "nothing aborted: one waited for the other"
        events = await incident.events()
        evicted = [e for e in events if e["event"] == "eviction_started"]
        assert [e["model"] for e in evicted] == ["bge-m3:latest"], "room made by class, not by luck"

        # A production hold needs whisper's memory too (and gemma3:12b's, which is cheaper
        # to reload per byte): the gate stops whisper for it.
        async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {TOKEN}"}) as s:
            ask = {"consumer": "ollama", "bytes": "12800MiB", "class": "production", "ttl": 60}
            async with s.post(incident.control + "/gate/v1/leases", json=ask) as r:
                assert r.status == 201, await r.text()
                held = await r.json()
            assert await incident.systemctl("is-active") == 3, "stopped to make room"
            async with s.delete(f"{incident.control}/gate/v1/leases/{held['id']}") as r:
                assert r.status == 200
        # The next transcription starts it again: the unit's admit joins the gate's lease.
        status, text = await transcribe(incident.whisper)
        assert status == 200, text
        assert await incident.systemctl("is-active") == 0
        log = incident.unit_log()
        assert log.count("ExecStartPre 0: gpugate admit: whisper: start lease") == 3
        assert incident.gpu.ooms() == []
        for _ in range(100):
            doc = await incident.status()
            if doc["leases"] == []:
                break
            await asyncio.sleep(0.1)
        assert doc["leases"] == []
    finally:
        gate.send_signal(signal.SIGTERM)
        gate.wait(timeout=30)
