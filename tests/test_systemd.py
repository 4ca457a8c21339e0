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


def test_gpugate_unit_is_notify_with_a_watchdog():
    assert _unit_setting("Type") == "notify"
    assert _unit_setting("NotifyAccess") == "main"
    assert int(_unit_setting("WatchdogSec")) > 0


def _receive(sock, timeout: float = 20.0) -> list[str]:
    sock.settimeout(timeout)
    return sock.recv(4096).decode().split("\n")


def test_serve_notifies_ready_watchdog_reloading_and_stopping(tmp_path, subprocess_env):
    import os
    import signal
    import socket

    from tests.gate.harness import free_port
    from tests.sim.processes import LineReader, kill_quietly

    config = tmp_path / "consumers.yaml"
    config.write_text(f"gate:\n  control: 127.0.0.1:{free_port()}\n")
    name = f"gpugate-notify-test-{os.getpid()}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind("\0" + name)  # abstract: '@name' in $NOTIFY_SOCKET
        env = {**subprocess_env, "NOTIFY_SOCKET": "@" + name, "WATCHDOG_USEC": "200000"}
        gate = subprocess.Popen(
            [sys.executable, "-m", "gpugate", "serve", "--config", str(config)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        LineReader(gate.stderr)
        try:
            first = _receive(sock)
            assert "READY=1" in first
            assert "gpugate: ready" in LineReader(gate.stdout).until("gpugate: ready")
            # Half of 200 ms: several pings arrive while the loop runs.
            assert _receive(sock, 2.0) == ["WATCHDOG=1"]
            assert _receive(sock, 2.0) == ["WATCHDOG=1"]
            gate.send_signal(signal.SIGHUP)
            seen = []
            while "READY=1" not in seen:
                seen += _receive(sock, 5.0)
            assert "RELOADING=1" in seen
            assert seen.index("RELOADING=1") < seen.index("READY=1")
            gate.send_signal(signal.SIGTERM)
            seen = []
            while "STOPPING=1" not in seen:
                seen += _receive(sock, 5.0)
            assert gate.wait(timeout=30) == 0
        finally:
            kill_quietly(gate)
