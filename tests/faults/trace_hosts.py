"""The hosts the seeded trace runs on (tests/faults/trace.py): each one's files on free ports,
direct (the runtimes as they were) or gated (the gate in front, whisper's unit admitted).

* `incident`: the 16 GiB card of the incidents (gpugate_sim/data/incident-2026-07-10.yaml);
* `two-cards`: the same home server with a second card (gpugate_sim/data/two-cards.yaml):
  Ollama on both cards, ComfyUI on the 4090, whisper-server on the 4080, Plex transcoding
  on the 4080 and the mVoice app on the 4090.
"""

from __future__ import annotations

import enum
import json
from pathlib import Path

import attrs
import yaml

from gpugate_sim.whisper import WhisperServerSpec
from tests.e2e.test_incident_whisper import (
    UNIT,
    consumers,
    incident_host,
    systemd_dir,
)
from tests.ports import free_ports
from tests.sim.comfyui_helpers import SD15

ROOT = Path(__file__).resolve().parents[2]
TWO_CARDS = ROOT / "gpugate_sim" / "data" / "two-cards.yaml"
PLEX = ["/usr/lib/plexmediaserver/Plex Transcoder", "-codec:0", "hevc"]
PORT_NAMES = ("ollama", "comfyui", "whisper", "mvoice", "listen", "comfyui_listen",
              "whisper_listen", "mvoice_listen", "control")  # fmt: skip


class HostName(enum.Enum):
    INCIDENT = "incident"
    TWO_CARDS = "two-cards"


@attrs.frozen
class TraceHost:
    """What the trace needs to know of a host: its Ollama models (MiB, as leased), where
    Plex transcodes, which cards leased work may ask for."""

    name: HostName
    models: dict[str, int]
    plex_gpu: int
    lease_gpus: tuple[int, ...]
    cards: int


INCIDENT = TraceHost(
    HostName.INCIDENT,
    {"gemma3:12b": 11600, "bge-m3": 2012, "llama3.2:3b": 3200, "qwen2.5:7b": 5700},
    plex_gpu=0,
    lease_gpus=(0,),
    cards=1,
)
TWO = TraceHost(
    HostName.TWO_CARDS,
    {
        "gemma3:12b": 7796,
        "bge-m3": 2012,
        "llama3.2:3b": 3200,
        "qwen2.5:7b": 5700,
        "gemma3:27b": 17800,
        "qwen2.5:32b": 20300,
        "mixtral:8x7b": 26112,
    },
    plex_gpu=1,
    lease_gpus=(0, 1),
    cards=2,
)
HOSTS = {host.name: host for host in (INCIDENT, TWO)}


def setup(
    host: TraceHost, tmp: Path, *, gated: bool, queue: dict[str, object] | None = None
) -> tuple[dict[str, int], Path, Path]:
    """The host file and the gate's configuration in `tmp`, on free ports; the fake
    systemd with whisper-server's unit (its gpugate drop-in only when gated); `queue`: the
    configuration's `queue` section (None: its defaults)."""
    ports = dict(zip(PORT_NAMES, free_ports(len(PORT_NAMES)), strict=True))
    if host.name is HostName.INCIDENT:
        data, spec = incident_host(ports)
        data["holders"].append({"name": "Plex Transcoder", "command": PLEX, "bytes": "256MiB"})
        config = yaml.safe_load(consumers(ports))
    else:
        data, spec = two_cards_host(ports)
        config = yaml.safe_load(consumers(ports))
        parts = config["consumers"]
        parts["ollama"]["gpus"] = [0, 1]
        parts["comfyui"]["gpu"] = 0
        parts["whisper"]["gpu"] = 1
        parts["mvoice"]["gpu"] = 0
    for model in data["ollama"]["models"]:
        model["load_seconds"] = "200ms"
    data["ollama"]["tokens_per_second"] = 400
    (tmp / "host.yaml").write_text(yaml.safe_dump(data))
    models = config["consumers"]["ollama"]["models"]
    for name, mib in host.models.items():
        models.setdefault(name, {})["envelope"] = f"{mib}MiB"
    # Its prompts' checkpoint by size, as an operator writes it: unsized, a file counts 8 GiB.
    config["consumers"]["comfyui"]["comfyui"] = {"files": {SD15: "2034MiB"}}
    config["external"] = {"plex": {"processes": {"commands": ["Plex Transcoder"]}}}
    config["classes"] = {c: {"max_wait": "20s"} for c in CLASSES}
    if queue is not None:
        config["queue"] = queue
    (tmp / "consumers.yaml").write_text(yaml.safe_dump(config))
    systemd_dir(tmp, spec, tmp / "state", tmp / "consumers.yaml")
    if not gated:  # the unit as it was before the gpugate drop-in
        unit = tmp / "systemd" / f"{UNIT}.json"
        unit.write_text(json.dumps({"exec": json.loads(unit.read_text())["exec"]}))
    return ports, tmp / "host.yaml", tmp / "consumers.yaml"


CLASSES = ("production", "interactive", "background", "benchmark", "maintenance")


def two_cards_host(ports: dict[str, int]) -> tuple[dict, WhisperServerSpec]:
    """The two-card host on free ports; whisper-server taken out (its unit runs it, on the
    4080 with `-dev 1`)."""
    data = yaml.safe_load(TWO_CARDS.read_text())
    data["ollama"]["listen"] = f"127.0.0.1:{ports['ollama']}"
    data["comfyui"]["listen"] = f"127.0.0.1:{ports['comfyui']}"
    whisper = data.pop("whisper")
    spec = WhisperServerSpec(
        listen=f"127.0.0.1:{ports['whisper']}",
        model=whisper["model"],
        models={k: int(v.removesuffix("MiB")) * 2**20 for k, v in whisper["models"].items()},
        load_seconds=0.5,
        decode_per_audio_second=0.05,
        gpu=whisper["gpu"],
    )
    return data, spec
