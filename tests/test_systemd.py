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
