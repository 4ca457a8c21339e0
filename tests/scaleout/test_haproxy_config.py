"""The HAProxy configuration docs/scale-out.md shows is the one the two-host test runs,
and Debian's HAProxy accepts it."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from tests.scaleout.haproxy import HAPROXY_LIBS, Host, haproxy_config, model_map

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "scale-out.md"
MAP = "/etc/haproxy/gpugate-models.map"
HOSTS = [Host("a", "192.0.2.11"), Host("b", "192.0.2.12")]
MODELS = ["llama3.2:3b", "qwen2.5:7b"]


def documented() -> tuple[str, str]:
    text = DOC.read_text()
    config = re.search(r"```haproxy\n(.*?)```", text, re.S)
    mapping = re.search(r"`/etc/haproxy/gpugate-models.map`.*?```\n(.*?)```", text, re.S)
    assert config and mapping, "docs/scale-out.md lost its HAProxy example"
    return config.group(1), mapping.group(1)


def test_the_documented_configuration_is_the_one_the_test_writes():
    config, mapping = documented()
    written = haproxy_config(HOSTS, MODELS, bind="*:11434", map_file=MAP, check="1s", agent="1s")
    assert config == written
    assert mapping == model_map({m: [] for m in MODELS})


def test_haproxy_accepts_the_documented_configuration(tmp_path):
    binary = ROOT / "build" / "haproxy" / "usr" / "sbin" / "haproxy"
    if not binary.exists():
        pytest.skip("make test unpacks Debian's haproxy into build/haproxy first")
    config, mapping = documented()
    (tmp_path / "models.map").write_text(mapping)
    (tmp_path / "haproxy.cfg").write_text(config.replace(MAP, str(tmp_path / "models.map")))
    checked = subprocess.run(
        [str(binary), "-c", "-f", str(tmp_path / "haproxy.cfg")],
        env={"LD_LIBRARY_PATH": str(ROOT / "build" / "haproxy" / HAPROXY_LIBS)},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "Configuration file is valid" in checked.stdout
