"""The shipped systemd units pass `systemd-analyze verify`."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ANALYZE = shutil.which("systemd-analyze")


@pytest.mark.skipif(ANALYZE is None, reason="systemd-analyze is part of every systemd host")
def test_gpugate_unit_verifies(tmp_path):
    unit = (ROOT / "systemd" / "gpugate.service").read_text()
    # The unit names /usr/local/bin/gpugate; verify checks that the command exists.
    gpugate = Path(sys.executable).with_name("gpugate")
    unit = unit.replace("/usr/local/bin/gpugate", str(gpugate))
    path = tmp_path / "gpugate.service"
    path.write_text(unit)
    result = subprocess.run(
        [ANALYZE, "verify", str(path)], capture_output=True, text=True, timeout=60
    )
    problems = [line for line in result.stderr.splitlines() if "gpugate.service" in line]
    assert result.returncode == 0 and problems == [], result.stderr


def test_ollama_drop_in_keeps_ollama_on_loopback():
    text = (ROOT / "systemd" / "ollama.service.d" / "gpugate.conf").read_text()
    assert "Environment=OLLAMA_HOST=127.0.0.1:11435" in text
    assert "Environment=OLLAMA_KEEP_ALIVE=-1" in text


def _unit_setting(name: str) -> str:
    text = (ROOT / "systemd" / "gpugate.service").read_text()
    return next(line.split("=", 1)[1] for line in text.splitlines() if line.startswith(name + "="))


def test_gpugate_unit_stops_after_the_grace_period_not_during_it():
    from gpugate.config.loader import load_config_text_with_warnings

    seed = ROOT / "consumers.yaml"
    grace = load_config_text_with_warnings(seed.read_text(), seed, {}).config.gate.shutdown_grace
    # The grace once, plus the margin the gate allows itself to close.
    assert float(_unit_setting("TimeoutStopSec")) >= grace + 5


def test_gpugate_unit_raises_the_open_files_limit_and_reloads_with_sighup():
    # The default 1,024 carries about 480 proxied connections in all.
    assert int(_unit_setting("LimitNOFILE")) >= 65536
    assert _unit_setting("ExecReload") == "/bin/kill -HUP $MAINPID"
