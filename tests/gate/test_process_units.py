"""A process runtime run by its systemd unit: the gate reads what the unit runs.

`systemctl` is tests.e2e.fake_systemctl (no systemd here): units are JSON files, the main
process is started detached, and `show --property=ExecStart` answers as systemd does.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import aiohttp
import pytest

from gpugate.core.effects import EventKind
from gpugate.core.residents import ResidentKey
from gpugate.runtimes.process_systemd import SystemdUnit
from gpugate_sim.serverprocess import child_env
from gpugate_sim.whisper import WhisperServerSpec, whisper_argv
from tests.gate.harness import running_stack
from tests.gate.test_process_start import BASE, SMALL, TURBO, WHISPER, transcribe
from tests.ports import free_ports

UNIT = "whisper-server.service"


@pytest.fixture
def units(tmp_path, monkeypatch):
    """The fake systemctl first on PATH; returns the directory of its unit files."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / "systemctl"
    script.write_text(f'#!/bin/sh\nexec {sys.executable} -m tests.e2e.fake_systemctl "$@"\n')
    script.chmod(0o755)
    directory = tmp_path / "systemd"
    directory.mkdir()
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_SYSTEMD_DIR", str(directory))
    root = child_env({})["PYTHONPATH"]
    monkeypatch.setenv("PYTHONPATH", root)
    yield directory
    subprocess.run(["systemctl", "stop", UNIT], check=False, cwd=root)


async def test_a_units_command_line_is_read_as_systemd_shows_it(units):
    argv = ["/usr/bin/whisper-server", "-m", "/models/ggml base.bin", "--port", "8081"]
    (units / f"{UNIT}.json").write_text(json.dumps({"exec": argv}))
    assert await SystemdUnit(UNIT).command() == argv


async def test_the_model_a_unit_starts_with_is_the_one_its_command_line_names(
    tmp_path, sim_host, fakenvml_path, units
):
    # The configuration names one model (so the gate would guess it); the unit runs another.
    listen, upstream = free_ports(2)
    spec = WhisperServerSpec(
        listen=f"127.0.0.1:{upstream}",
        model=BASE,
        models={TURBO: WHISPER, BASE: SMALL},
        load_seconds=0.2,
    )
    (units / f"{UNIT}.json").write_text(
        json.dumps({"exec": whisper_argv(spec, sim_host.directory)})
    )
    extra = textwrap.indent(
        textwrap.dedent(f"""\
          whisper:
            runtime: whisper
            listen: 127.0.0.1:{listen}
            upstream: http://127.0.0.1:{upstream}
            class: background
            envelope: 2050MiB
            processes: {{commands: ["whisper-server"]}}
            models:
              {TURBO}: {{envelope: 2050MiB}}
            control:
              unit: {UNIT}
              start_timeout: 20s
        """),
        "  ",
    )
    async with running_stack(tmp_path, sim_host, fakenvml_path, extra=extra) as stack:
        gate = stack.gate
        granted = stack.next_event(EventKind.LEASE_GRANTED, key=ResidentKey("whisper", BASE))
        status, text = await transcribe(f"http://127.0.0.1:{listen}")
        assert status == 200, text
        await granted
        assert gate.links["whisper"].runtime.lifecycle.process_model() == BASE
        assert gate.core.resident(ResidentKey("whisper", BASE)) is not None
        assert gate.core.resident(ResidentKey("whisper", TURBO)) is None
        async with (
            aiohttp.ClientSession() as session,
            session.get(f"http://127.0.0.1:{upstream}/health") as resp,
        ):
            assert resp.status == 200
