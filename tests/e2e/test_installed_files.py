"""The files the package carries, from an installed wheel: every one of gpugate/share/ is in
the wheel and installed, byte for byte (gpugate.packaged: they exist once, in the source),
`gpugate share` finds them, and the unit and drop-ins that the installed `gpugate init
--out DIR` writes for the simulated incident host (tests/init/simhost.py: its runtimes in
faked units) pass `systemd-analyze verify`, each drop-in over the packaged example unit of
its runtime, as tests/test_systemd.py verifies the shipped ones.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import zipfile
from pathlib import Path

import pytest

from gpugate.packaged import SHARE, listing
from tests.e2e.test_installed_demo import build_wheel, install
from tests.init.simhost import IncidentHost, incident
from tests.ports import free_port

__all__ = ["incident"]

ANALYZE = shutil.which("systemd-analyze")
RUNTIME_UNITS = ("ollama.service", "comfyui.service", "whisper-server.service")
BASE_PROGRAMS = (
    "/usr/local/bin/ollama",
    "/usr/local/bin/whisper-server",
    "/opt/ComfyUI/venv/bin/python",
    "/usr/bin/python3",
)
"""Programs the base units and the drop-ins name; verify checks that each exists, so the
test puts `true` there (the gate's own program is the installed gpugate, left as written)."""


def runnable(text: str) -> str:
    true = shutil.which("true")
    assert true is not None
    for program in BASE_PROGRAMS:
        text = text.replace(program, true)
    return text


@pytest.mark.e2e
@pytest.mark.skipif(ANALYZE is None, reason="systemd-analyze is part of every systemd host")
def test_the_wheel_carries_every_packaged_file_and_init_writes_units_that_verify(
    tmp_path: Path, incident: IncidentHost, fakenvml_path: Path
) -> None:
    wheel = build_wheel(tmp_path)
    names = listing()
    assert "systemd/gpugate.service" in names and "deploy/helm/gpugate/Chart.yaml" in names
    with zipfile.ZipFile(wheel) as packed:
        packed_names = set(packed.namelist())
        for name in names:
            assert f"gpugate/share/{name}" in packed_names, name
            assert packed.read(f"gpugate/share/{name}") == (SHARE / name).read_bytes(), name

    venv = tmp_path / "venv"
    install(wheel, venv)
    gpugate = venv / "bin" / "gpugate"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}

    def run(*argv: str) -> str:
        done = subprocess.run(
            [str(gpugate), *argv], capture_output=True, text=True, env=env, cwd=tmp_path,
            timeout=300,
        )  # fmt: skip
        assert done.returncode == 0, (argv, done.stdout, done.stderr)
        return done.stdout

    installed = Path(run("share").strip())
    assert installed.is_relative_to(venv), installed
    assert run("share", "--list").split() == names
    for name in names:
        assert (installed / name).read_bytes() == (SHARE / name).read_bytes(), name

    out = tmp_path / "proposal"
    printed = run(
        "init", "--out", str(out),
        "--proc-root", str(incident.proc_root),
        "--nvml-library", str(fakenvml_path),
        "--control", f"127.0.0.1:{free_port()}",
        "--database", str(tmp_path / "gpugate.db"),
    )  # fmt: skip
    written = sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file())
    assert written == sorted(
        [
            "consumers.yaml",
            "gpugate.service",
            "moves.txt",
            *(f"{unit}.d/gpugate.conf" for unit in RUNTIME_UNITS),
        ]
    )
    unit = (out / "gpugate.service").read_text()
    shipped = (installed / "systemd" / "gpugate.service").read_text()
    assert unit.endswith(shipped.replace("/usr/local/bin/gpugate", str(gpugate)))
    assert f"sudo install -m 0644 {out}/gpugate.service /etc/systemd/system/" in printed
    assert "from gpugate's source" not in printed

    # The gate's unit as written; each runtime's packaged example unit with init's drop-in.
    verified = tmp_path / "verified"
    verified.mkdir()
    (verified / "gpugate.service").write_text(unit)
    for name in RUNTIME_UNITS:
        base = (installed / "systemd" / "examples" / name).read_text()
        (verified / name).write_text(runnable(base))
        (verified / f"{name}.d").mkdir()
        drop_in = (out / f"{name}.d" / "gpugate.conf").read_text()
        (verified / f"{name}.d" / "gpugate.conf").write_text(runnable(drop_in))
    for name in ("gpugate.service", *RUNTIME_UNITS):
        result = subprocess.run(
            [ANALYZE, "verify", str(verified / name)],
            capture_output=True, text=True, timeout=60, cwd=verified,
        )  # fmt: skip
        problems = [line for line in result.stderr.splitlines() if name in line]
        assert result.returncode == 0 and problems == [], (name, result.stderr)
    whisper = (out / "whisper-server.service.d" / "gpugate.conf").read_text()
    assert f"ExecStart={gpugate} admit whisper" in whisper
