"""The configuration files shipped with gpugate pass `gpugate check`, and the demo's
ComfyUI is fronted."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from gpugate.config.loader import load_config
from gpugate.runtimes.comfyui import ComfyUIAdapter
from gpugate.runtimes.registry import adapter_for

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = sorted(p for p in ROOT.glob("**/*consumers*.yaml") if ".venv" not in p.parts)


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: str(p.relative_to(ROOT)))
def test_a_shipped_configuration_passes_check(path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "gpugate", "check", str(path)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_demo_fronts_comfyui() -> None:
    config = load_config(ROOT / "sim" / "demo-consumers.yaml")
    [comfyui] = [c for c in config.consumers if c.name == "comfyui"]
    assert isinstance(adapter_for(comfyui), ComfyUIAdapter)
    assert comfyui.files
