"""The configuration files shipped with gpugate pass `gpugate check`, and the demo's
ComfyUI is fronted."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from gpugate.runtimes.comfyui.adapter import ComfyUIReading
from gpugate.runtimes.comfyui.settings import ComfyUISettings
from gpugate.runtimes.registry import runtime_for
from gpugate.runtimes.sections import load_config

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
    config = load_config(ROOT / "gpugate" / "sim" / "data" / "demo-consumers.yaml")
    [comfyui] = [c for c in config.consumers if c.name == "comfyui"]
    runtime = runtime_for(comfyui)
    assert runtime is not None and isinstance(runtime.reading, ComfyUIReading)
    assert comfyui.settings_as(ComfyUISettings).files


def test_the_demos_flux_prompt_is_the_graph_the_gate_sizes():
    from gpugate.runtimes.comfyui.graph import PromptDemand, read_prompt
    from tests.sim.comfyui_helpers import flux

    body = (ROOT / "gpugate" / "sim" / "data" / "flux-prompt.json").read_bytes()
    assert json.loads(body)["prompt"] == flux()
    demand = read_prompt(body)
    assert isinstance(demand, PromptDemand)
    assert {f.name for f in demand.files} == {
        "flux1-dev-fp8.safetensors",
        "t5xxl_fp8_e4m3fn.safetensors",
        "clip_l.safetensors",
        "ae.safetensors",
    }
