"""The shipped systemd units pass `systemd-analyze verify`."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SYSTEMD = ROOT / "gpugate" / "share" / "systemd"
ANALYZE = shutil.which("systemd-analyze")


@pytest.mark.skipif(ANALYZE is None, reason="systemd-analyze is part of every systemd host")
def test_gpugate_unit_verifies(tmp_path):
    path = _installed_gpugate_unit(tmp_path)
    result = subprocess.run(
        [ANALYZE, "verify", str(path)], capture_output=True, text=True, timeout=60
    )
    problems = [line for line in result.stderr.splitlines() if "gpugate.service" in line]
    assert result.returncode == 0 and problems == [], result.stderr


EXPOSURE_LIMIT = 2.0
"""`systemd-analyze security` rates the gate's unit at most this (1.8 now; 7.6 unsandboxed)."""


def _analyze_version() -> str:
    result = subprocess.run([ANALYZE, "--version"], capture_output=True, text=True, timeout=60)
    return result.stdout.splitlines()[0] if result.stdout else "unknown version"


def _installed_gpugate_unit(tmp_path: Path) -> Path:
    # The unit names /usr/local/bin/gpugate; verify checks that the command exists.
    unit = (SYSTEMD / "gpugate.service").read_text()
    gpugate = Path(sys.executable).with_name("gpugate")
    path = tmp_path / "gpugate.service"
    path.write_text(unit.replace("/usr/local/bin/gpugate", str(gpugate)))
    return path


@pytest.mark.skipif(ANALYZE is None, reason="systemd-analyze is part of every systemd host")
def test_gpugate_unit_is_rated_at_most_2_by_systemd_analyze_security(tmp_path):
    path = _installed_gpugate_unit(tmp_path)
    result = subprocess.run(
        [ANALYZE, "security", "--offline=yes", "--no-pager", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    if "--offline" in result.stderr and result.returncode != 0:
        # The offline review came with systemd 250.
        pytest.skip(f"{_analyze_version()} has no offline security review: {result.stderr}")
    found = re.search(r"Overall exposure level for gpugate\.service: (\d+\.\d+)", result.stdout)
    assert result.returncode == 0 and found is not None, result.stdout + result.stderr
    assert float(found[1]) <= EXPOSURE_LIMIT, result.stdout


def _directives(text: str, name: str) -> list[str]:
    return [line.split("=", 1)[1] for line in text.splitlines() if line.startswith(name + "=")]


def test_gpugate_unit_s_sandbox_keeps_what_the_gate_reads_and_opens():
    unit = (SYSTEMD / "gpugate.service").read_text()
    # Attribution reads every user's /proc/PID and /proc/net/tcp; NVML /proc/driver/nvidia.
    assert _directives(unit, "ProtectProc") in ([], ["default"])
    assert _directives(unit, "ProcSubset") in ([], ["all"])
    # NVML's device nodes, by group name: nvidia-uvm may be made after the gate starts.
    assert _directives(unit, "DevicePolicy") == ["closed"]
    assert "char-nvidia* rw" in _directives(unit, "DeviceAllow")
    assert _directives(unit, "PrivateDevices") in ([], ["no"])
    # sd_notify and systemctl's bus (AF_UNIX), the listeners (AF_INET, AF_INET6).
    (families,) = _directives(unit, "RestrictAddressFamilies")
    assert {"AF_UNIX", "AF_INET", "AF_INET6"} <= set(families.split())
    assert _directives(unit, "CapabilityBoundingSet") == [""]
    assert "@system-service" in _directives(unit, "SystemCallFilter")


def test_gpugate_unit_passes_its_tokens_as_credentials():
    unit = (SYSTEMD / "gpugate.service").read_text()
    assert _directives(unit, "LoadCredential") == [
        "control.token:/etc/gpugate/control.token",
        "admit.token:/etc/gpugate/admit.token",
    ]
    whisper = _drop_in("whisper-server")
    # The admit token reaches `gpugate admit` as a credential, never through the environment.
    assert _directives(whisper, "LoadCredential") == ["gpugate-token:/etc/gpugate/admit.token"]
    for runtime in RUNTIMES:
        text = _drop_in(runtime)
        assert _directives(text, "EnvironmentFile") == [], runtime
        assert "GPUGATE_TOKEN" not in "".join(_directives(text, "Environment")), runtime


def test_ollama_drop_in_keeps_ollama_on_loopback():
    text = (SYSTEMD / "ollama.service.d" / "gpugate.conf").read_text()
    assert "Environment=OLLAMA_HOST=127.0.0.1:11435" in text
    assert "Environment=OLLAMA_KEEP_ALIVE=-1" in text


RUNTIMES = ("ollama", "comfyui", "whisper-server")
PROGRAMS = (
    "/usr/local/bin/gpugate",
    "/usr/local/bin/ollama",
    "/usr/local/bin/whisper-server",
    "/opt/ComfyUI/venv/bin/python",
)
"""Programs the units name; verify checks that each exists, so the test puts `true` there."""


def _drop_in(runtime: str) -> str:
    return (SYSTEMD / f"{runtime}.service.d" / "gpugate.conf").read_text()


def _runnable(text: str) -> str:
    true = shutil.which("true")
    assert true is not None
    for program in PROGRAMS:
        text = text.replace(program, true)
    return text


@pytest.mark.skipif(ANALYZE is None, reason="systemd-analyze is part of every systemd host")
@pytest.mark.parametrize("runtime", RUNTIMES)
def test_each_runtime_unit_verifies_with_its_drop_in(tmp_path, runtime):
    # The example unit is the base the drop-in is verified against; verify reads the
    # drop-in from UNIT.service.d/ next to the unit, and the gate's unit (After=, Wants=).
    for name, text in (
        (f"{runtime}.service", (SYSTEMD / "examples" / f"{runtime}.service").read_text()),
        ("gpugate.service", (SYSTEMD / "gpugate.service").read_text()),
        (f"{runtime}.service.d/gpugate.conf", _drop_in(runtime)),
    ):
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_text(_runnable(text))
    result = subprocess.run(
        [ANALYZE, "verify", str(tmp_path / f"{runtime}.service")],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert result.returncode == 0 and result.stderr == "", result.stderr


def _setting(text: str, name: str) -> list[str]:
    return [line.split("=", 1)[1] for line in text.splitlines() if line.startswith(name + "=")]


def test_drop_ins_put_each_runtime_where_the_example_configuration_expects_it():
    from gpugate.runtimes.sections import load_config_text_with_warnings

    seed = ROOT / "consumers.yaml"
    config = load_config_text_with_warnings(seed.read_text(), seed, {}).config
    upstream = {c.name: c.upstream for c in config.consumers}
    assert _setting(_drop_in("ollama"), "Environment")[0] == (
        f"OLLAMA_HOST={upstream['ollama'].host}:{upstream['ollama'].port}"
    )
    for runtime, consumer, flags in (
        ("comfyui", "comfyui", "--listen {host} --port {port}"),
        ("whisper-server", "whisper", "--host {host} --port {port}"),
    ):
        # ExecStart= is a list: an override first clears it with an empty assignment.
        first, command = _setting(_drop_in(runtime), "ExecStart")
        address = upstream[consumer]
        assert first == "" and command.endswith(flags.format(host=address.host, port=address.port))


def test_whisper_s_start_is_admitted_and_a_refusal_that_repeats_stops_it():
    from gpugate.core.units import parse_duration
    from gpugate.runtimes.sections import load_config_text_with_warnings

    seed = ROOT / "consumers.yaml"
    whisper = load_config_text_with_warnings(seed.read_text(), seed, {}).config.consumer("whisper")
    assert whisper.control is not None and whisper.control.unit == "whisper-server.service"
    text = _drop_in("whisper-server")
    # The admission is the unit's main process, which becomes whisper-server once admitted.
    assert _setting(text, "ExecStartPre") == []
    first, admit = _setting(text, "ExecStart")
    words = admit.split()
    assert first == "" and words[:3] == ["/usr/local/bin/gpugate", "admit", "whisper"]
    assert parse_duration(words[words.index("--wait") + 1]) > 0
    assert words[words.index("--") + 1] == "/usr/local/bin/whisper-server"
    # What a retry cannot mend stops the unit; no room (75) and no gate (69) are retried.
    from gpugate.commands.exits import Exit

    (prevent,) = _setting(text, "RestartPreventExitStatus")
    codes = {int(code) for code in prevent.split()}
    assert codes == {Exit.USAGE, Exit.DATAERR, Exit.NOPERM, Exit.CONFIG}
    assert Exit.TEMPFAIL not in codes and Exit.UNAVAILABLE not in codes
    # Ollama and ComfyUI hold nothing worth admitting at start (see their drop-ins).
    assert _setting(_drop_in("ollama"), "ExecStartPre") == []
    assert _setting(_drop_in("comfyui"), "ExecStartPre") == []


def _unit_setting(name: str) -> str:
    text = (SYSTEMD / "gpugate.service").read_text()
    return next(line.split("=", 1)[1] for line in text.splitlines() if line.startswith(name + "="))


def test_gpugate_unit_stops_after_the_grace_period_not_during_it():
    from gpugate.runtimes.sections import load_config_text_with_warnings

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

    from tests.ports import free_port
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
