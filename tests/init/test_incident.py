"""`gpugate init` on the simulated incident host: what it finds, what it prints, and that
the printed configuration, served, fronts every runtime it found.

The host (tests/init/simhost.py) is the incident card of 2026-07-10 on free ports, with
Plex and Tdarr transcoding on it, its runtimes in (faked) systemd units. Init reads it
through the real pynvml over the fake NVML library and through a proc root restricted to
the host's processes.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import os
import re
import shlex
from pathlib import Path

import aiohttp
import pytest

from gpugate.cli import main
from gpugate.config.check import run_check
from gpugate.core.classes import ResidencyPolicy
from gpugate.init.recognise import Address, recognise
from gpugate.init.scan import scan_host
from gpugate.init.write import split_dry_run
from gpugate.runtimes.comfyui.settings import ComfyUISettings
from gpugate.runtimes.ollama.settings import OllamaSettings
from gpugate.runtimes.sections import (
    RUNTIME_TABLE,
    load_config_text,
    load_config_text_with_warnings,
)
from gpugate.serve import serve
from tests.init.simhost import (
    OLLAMA_ORIGINS,
    ROLES,
    UNITS,
    IncidentHost,
    bindable,
    start_incident,
)
from tests.ports import free_port

MiB = 1024 * 1024
SYSTEMCTL_READS = ("show", "is-active")
"""What init may ask systemctl: it reads units, never starts, stops or reloads them."""

GEMMA, BGE = 8_734_445_440, 1_695_784_960
"""What the incident's two preloaded runners hold: the llama-servers Ollama starts for the
models' shapes (the host file's)."""


def run_dry(incident: IncidentHost, tmp: Path, library: Path, *extra: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    argv = [
        "init", "--dry-run",
        "--proc-root", str(incident.proc_root),
        "--nvml-library", str(library),
        "--control", f"127.0.0.1:{free_port()}",
        "--database", str(tmp / "gpugate.db"),
        *extra,
    ]  # fmt: skip
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    return code, out.getvalue(), err.getvalue()


def test_the_scan_finds_each_runtime_its_unit_and_what_it_holds(
    incident: IncidentHost, fakenvml_path: Path
) -> None:
    scan = scan_host(incident.proc_root, fakenvml_path)
    assert [d.name for d in scan.devices] == ["NVIDIA GeForce RTX 4080"]
    found = recognise(scan)
    runtimes = {f.kind: f for f in found.runtimes}
    assert sorted(runtimes) == sorted(ROLES)
    for role in ROLES:
        runtime = runtimes[role]
        assert runtime.process.pid == incident.pids[role]
        assert runtime.process.unit == UNITS[role]
        assert runtime.address == Address("127.0.0.1", incident.ports[role], "its listening socket")
    ollama = runtimes["ollama"]
    # The two preloaded models are held by runner children of `ollama serve`.
    assert sorted(p.pid for p in ollama.gpu_use) == incident.children("ollama")
    assert ollama.bytes_now == GEMMA + BGE
    assert runtimes["whisper"].bytes_now == 2050 * MiB
    assert runtimes["comfyui"].bytes_now == 210 * MiB
    assert runtimes["whisper"].model == "models/ggml-large-v3-turbo.bin"

    external = {f.kind: f for f in found.external}
    assert sorted(external) == ["plex", "tdarr"]
    assert external["plex"].process.unit == "plexmediaserver.service"
    assert external["plex"].bytes_now == 1536 * MiB
    assert external["tdarr"].process.unit is None
    assert [p.pid for p in external["tdarr"].gpu_use] == incident.children("tdarr")
    assert external["tdarr"].bytes_now == 600 * MiB

    # mVoice is a python3 program no rule knows: listed, with its bytes, and left out.
    (unknown,) = found.unknown
    assert unknown.pid == incident.pids["mvoice"]
    assert unknown.used == 292 * MiB
    assert "mvoice_server.py" in unknown.command


def test_the_dry_run_prints_a_configuration_that_checks_clean_and_fronts_every_runtime(
    incident: IncidentHost, fakenvml_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    code, printed, err = run_dry(incident, tmp_path, fakenvml_path)
    assert code == 0, err
    files = split_dry_run(printed)
    assert sorted(files) == sorted(
        [
            "consumers.yaml",
            "ollama.service.d/gpugate.conf",
            "comfyui.service.d/gpugate.conf",
            "whisper-server.service.d/gpugate.conf",
            "gpugate.service",
            "moves.txt",
        ]
    )
    text = files["consumers.yaml"]
    # Checked as `gpugate check` checks it, where the token files are not (yet) readable:
    # the only warnings are the two control tokens the moves make.
    monkeypatch.delenv("CREDENTIALS_DIRECTORY", raising=False)
    loaded = load_config_text_with_warnings(text, tmp_path / "consumers.yaml")
    assert [w.path for w in loaded.warnings] == [
        "gate.control_tokens[0]",
        "gate.control_tokens[1].token",
    ]
    config = loaded.config
    consumers = {c.name: c for c in config.consumers}
    assert sorted(consumers) == sorted(ROLES)
    upstreams = {}
    for role in ROLES:
        consumer = consumers[role]
        # The gate takes the address the runtime listens on now; the runtime moves to the
        # next port up, on loopback.
        assert str(consumer.listen) == f"127.0.0.1:{incident.ports[role]}"
        assert consumer.upstream.host == "127.0.0.1"
        assert consumer.upstream.port == incident.ports[role] + 1
        assert consumer.processes.units == (UNITS[role],)
        upstreams[role] = consumer.upstream.port
    assert consumers["ollama"].runtime == "ollama"
    assert consumers["ollama"].settings_as(OllamaSettings).origins == (OLLAMA_ORIGINS,)
    models = {m.name: m.envelope for m in consumers["ollama"].models}
    # What each runner holds, rounded up to the MiB as written.
    assert models == {"gemma3:12b": 8330 * MiB, "bge-m3:latest": 1618 * MiB}
    assert consumers["comfyui"].residency.policy is ResidencyPolicy.LOAD_ON_DEMAND
    files_sized = {
        f"{f.pattern.folder}/{f.pattern.name}": f.size
        for f in consumers["comfyui"].settings_as(ComfyUISettings).files
    }
    assert files_sized["diffusion_models/flux1-dev-fp8.safetensors"] == 11350 * MiB
    assert files_sized["text_encoders/t5xxl_fp8_e4m3fn.safetensors"] == 4667 * MiB
    whisper = consumers["whisper"]
    assert whisper.envelope == 2050 * MiB
    assert whisper.residency.policy is ResidencyPolicy.ALWAYS_WARM
    assert whisper.control is not None and whisper.control.unit == "whisper-server.service"
    external = {e.name: e for e in config.external}
    assert sorted(external) == ["plex", "tdarr"]
    assert external["plex"].processes.units == ("plexmediaserver.service",)
    assert "Tdarr_Node" in external["tdarr"].processes.commands

    # `gpugate check` itself, on the printed file, with the tokens where the unit puts them.
    creds = tmp_path / "credentials"
    creds.mkdir()
    for name in ("control", "admit"):
        (creds / f"{name}.token").write_text(f"{name}-token-for-the-test\n")
    monkeypatch.setenv("CREDENTIALS_DIRECTORY", str(creds))
    path = tmp_path / "consumers.yaml"
    path.write_text(text)
    out, errors = io.StringIO(), io.StringIO()
    assert run_check(path, out, errors, runtimes=RUNTIME_TABLE) == 0, errors.getvalue()
    assert errors.getvalue() == ""
    assert "3 consumers (whisper, ollama, comfyui), 2 external services" in out.getvalue()

    # The drop-ins move each runtime exactly where the configuration says it is.
    ollama_dropin = files["ollama.service.d/gpugate.conf"]
    assert f"Environment=OLLAMA_HOST=127.0.0.1:{upstreams['ollama']}" in ollama_dropin
    assert "Environment=OLLAMA_KEEP_ALIVE=-1" in ollama_dropin
    comfy = _exec_start(files["comfyui.service.d/gpugate.conf"])
    # ComfyUI sizes its loads to the free memory less --reserve-vram: the gate's reserve.
    assert comfy == [
        "/usr/bin/python3", "ComfyUI/main.py", "--listen", "127.0.0.1",
        "--port", str(upstreams["comfyui"]), "--reserve-vram", "1",
    ]  # fmt: skip
    whisper_dropin = files["whisper-server.service.d/gpugate.conf"]
    assert _exec_start(whisper_dropin)[-4:] == [
        "--host", "127.0.0.1", "--port", str(upstreams["whisper"])
    ]  # fmt: skip
    admitted = _exec_start(whisper_dropin)
    assert admitted[1 : admitted.index("--")] == [
        "admit", "whisper", "--wait", "5m", "--config", "/etc/gpugate/consumers.yaml",
    ]  # fmt: skip
    assert "RestartPreventExitStatus=64 65 77 78" in whisper_dropin

    # The moves: mVoice named as unknown, and nothing was run.
    moves = files["moves.txt"]
    assert f"unknown: pid {incident.pids['mvoice']}, python3 /opt/mvoice/mvoice_server.py" in moves
    assert "292 MiB on GPU 0" in moves
    assert "sudo systemctl restart ollama.service" in moves
    assert "sudo systemctl stop whisper-server.service" in moves
    log = Path(os.environ["FAKE_SYSTEMCTL_LOG"]).read_text().splitlines()
    assert log and {line.split()[0] for line in log} <= set(SYSTEMCTL_READS)


def _exec_start(drop_in: str) -> list[str]:
    """The argv of a drop-in's (second, non-empty) ExecStart= line."""
    (line,) = [x for x in drop_in.splitlines() if x.startswith("ExecStart=") and x != "ExecStart="]
    return shlex.split(line.split("=", 1)[1])


def _moved_ports(files: dict[str, str]) -> dict[str, int]:
    """Where the drop-ins move each runtime: what a restart under them would listen on."""
    ollama = re.search(r"OLLAMA_HOST=127\.0\.0\.1:(\d+)", files["ollama.service.d/gpugate.conf"])
    assert ollama is not None
    ports = {"ollama": int(ollama[1])}
    for role, unit in (("comfyui", "comfyui.service"), ("whisper", "whisper-server.service")):
        argv = _exec_start(files[f"{unit}.d/gpugate.conf"])
        ports[role] = int(argv[argv.index("--port") + 1])
    return ports


async def test_served_the_printed_configuration_fronts_every_runtime_it_found(
    incident: IncidentHost, fakenvml_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    code, printed, err = run_dry(incident, tmp_path, fakenvml_path)
    assert code == 0, err
    files = split_dry_run(printed)
    config_text = files["consumers.yaml"]

    # The moves: each runtime restarted where its drop-in puts it (the same host, its
    # processes anew), and the proc root shown again for the gate's attribution.
    moved = _moved_ports(files)
    assert all(bindable(port) for port in moved.values())
    incident.host.stop()
    again = start_incident(tmp_path, moved, monkeypatch)
    try:
        assert again.pids.keys() == incident.pids.keys()
        assert again.proc_root == incident.proc_root
        creds = tmp_path / "credentials"
        creds.mkdir()
        for name in ("control", "admit"):
            (creds / f"{name}.token").write_text(f"{name}-token-for-the-test\n")
        monkeypatch.setenv("CREDENTIALS_DIRECTORY", str(creds))
        config = load_config_text(config_text, tmp_path / "consumers.yaml")

        ready: asyncio.Future[list[str]] = asyncio.get_running_loop().create_future()
        stop = asyncio.Event()
        task = asyncio.create_task(serve(config, stop, on_ready=ready.set_result))
        try:
            lines = await asyncio.wait_for(asyncio.shield(ready), 30)
            listening = {
                line.split(":")[1].split()[0] for line in lines if " listening on " in line
            }
            assert listening == set(ROLES), lines
            control = next(x for x in lines if "control on" in x).split(" on ")[1].split(" ")[0]
            await _through_the_gate(incident.ports, control)
        finally:
            stop.set()
            await asyncio.wait_for(task, 30)
    finally:
        again.host.stop()


async def _through_the_gate(ports: dict[str, int], control: str) -> None:
    """A request through each listener the configuration names reaches its runtime, and
    the gate counts each runtime's memory as the consumer's, Plex's and Tdarr's as theirs."""
    async with aiohttp.ClientSession() as session:
        async with session.get(f"http://127.0.0.1:{ports['ollama']}/api/tags") as resp:
            assert resp.status == 200
            names = {m["name"] for m in (await resp.json())["models"]}
            assert {"gemma3:12b", "bge-m3:latest"} <= names
        async with session.get(f"http://127.0.0.1:{ports['comfyui']}/system_stats") as resp:
            assert resp.status == 200
            assert "devices" in await resp.json()
        async with session.get(f"http://127.0.0.1:{ports['whisper']}/health") as resp:
            assert resp.status == 200
            assert (await resp.json()) == {"status": "ok"}
        # The budget of the sample the gate took before it was ready: every process
        # attributed (units read from the proc root's cgroups).
        async with session.get(control + "/gate/v1/status") as resp:
            (gpu,) = (await resp.json())["gpus"]
        observed = {name: row["observed"] for name, row in gpu["consumers"].items()}
        assert observed == {
            "ollama": GEMMA + BGE, "whisper": 2050 * MiB, "comfyui": 210 * MiB
        }  # fmt: skip
        assert gpu["external"]["plex"] == 1536 * MiB
        assert gpu["external"]["tdarr"] == 600 * MiB
        assert gpu["external"]["other"] == 292 * MiB
