"""`gpugate status` end to end: the incident host run by `gpugate sim run`, read through the
fake libnvidia-ml by the real pynvml in a separate `gpugate status` process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from gpugate.commands.exits import Exit
from gpugate.core.units import GiB, MiB
from gpugate_sim.hostprocess import SimulatedHostProcess
from tests.ports import free_port, free_ports

ROOT = Path(__file__).resolve().parents[2]
INCIDENT = ROOT / "gpugate_sim" / "data" / "incident-2026-07-10.yaml"
SEED_CONFIG = ROOT / "consumers.yaml"
TOKENS = {"GPUGATE_BATCH_TOKEN": "batch-secret", "GPUGATE_OPS_TOKEN": "ops-secret"}


@pytest.fixture(scope="module")
def incident(tmp_path_factory):
    """The seed incident, with its simulated Ollama on a free port."""
    tmp = tmp_path_factory.mktemp("incident")
    spec = yaml.safe_load(INCIDENT.read_text())
    ollama_port, control_port, whisper_port = free_ports(3)
    spec["ollama"]["listen"] = f"127.0.0.1:{ollama_port}"
    spec["whisper"]["listen"] = f"127.0.0.1:{whisper_port}"
    host_file = tmp / "incident.yaml"
    host_file.write_text(yaml.safe_dump(spec))
    config = tmp / "consumers.yaml"
    # The seed config, with a control port nothing listens on.
    config.write_text(
        SEED_CONFIG.read_text().replace("127.0.0.1:9411", f"127.0.0.1:{control_port}")
    )
    with SimulatedHostProcess(host_file, tmp / "state") as host:
        assert host.environment is not None
        env = host.environment.apply({**os.environ, **TOKENS})
        yield env, config


def status(env, config, *extra):
    return subprocess.run(
        [sys.executable, "-m", "gpugate", "status", "--config", str(config), *extra],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


OLLAMA = 10_430_230_400
"""gemma3:12b's runner (8,329.8 MiB) and bge-m3's (1,617.2 MiB): what the llama-servers
Ollama starts for them hold (their shapes in the incident's host file)."""


def test_status_json_attributes_the_incident(incident):
    env, config = incident
    result = status(env, config, "--json")
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    assert document["source"] == "nvml"
    (gpu,) = document["gpus"]
    consumers = {name: row["observed"] for name, row in gpu["consumers"].items()}
    assert consumers == {
        "ollama": OLLAMA,
        "whisper": 2050 * MiB,
        "mvoice": 292 * MiB,
        "comfyui": 210 * MiB,
    }
    assert gpu["total"] == 16 * GiB and gpu["driver_reserved"] == 434 * MiB
    assert gpu["reserve"] == 1 * GiB
    managed = OLLAMA + (2050 + 292 + 210) * MiB
    assert gpu["schedulable"] == (
        gpu["total"] - gpu["driver_reserved"] - gpu["external_total"] - managed - gpu["reserve"]
    )
    assert gpu["external_total"] == 0  # nothing else holds memory in the incident
    assert gpu["schedulable"] == (16384 - 434 - 2050 - 292 - 210 - 1024) * MiB - OLLAMA


def test_status_text_reads_like_a_table(incident):
    env, config = incident
    result = status(env, config)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith("no gate running: sampled NVML directly")
    assert lines[1].startswith("GPU 0  NVIDIA GeForce RTX 4080  GPU-")
    table = {line.split()[0]: line for line in lines[2:]}
    assert "9.7 GiB" in table["ollama"] and "2.0 GiB" in table["whisper"]
    assert "0.3 GiB" in table["mvoice"] and "0.2 GiB" in table["comfyui"]
    # Consumers sorted by bytes, largest first.
    order = [line.split()[0] for line in lines if line.startswith("    ")]
    assert order == ["ollama", "whisper", "mvoice", "comfyui"]
    assert "schedulable" in table and "2.4 GiB" in table["schedulable"]


def test_status_without_nvml_says_why(tmp_path):
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("LD_LIBRARY_PATH", "GPUGATE_NVML_LIBRARY", "GPUGATE_FAKE_NVML_STATE")
    }
    env["GPUGATE_NVML_LIBRARY"] = str(tmp_path / "missing" / "libnvidia-ml.so.1")
    config = tmp_path / "empty.yaml"
    port = free_port()
    config.write_text(f"gate:\n  control: 127.0.0.1:{port}\n")
    result = status(env, config, "--json")
    assert result.returncode == Exit.UNAVAILABLE
    # No gate first: that is what an operator runs `status` to learn.
    assert result.stderr.startswith(f"gpugate status: no gate answers at http://127.0.0.1:{port} ")
    assert "and NVML cannot be read here: DRIVER_ERROR: NVML " in result.stderr
    assert result.stdout == ""


def test_status_with_a_bad_config_exits_78(tmp_path, incident):
    env, _ = incident
    config = tmp_path / "bad.yaml"
    config.write_text("budget:\n  reserve: lots\n")
    result = status(env, config)
    assert result.returncode == Exit.CONFIG
    assert "bad.yaml:2: budget.reserve: expected a size" in result.stderr
