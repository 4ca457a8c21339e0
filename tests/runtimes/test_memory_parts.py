"""Each runtime's memory part: how its loads take memory, a load's floor and ceiling, and
the knob that tells it the most it may take."""

from __future__ import annotations

import json

import pytest

from gpugate.core.classes import PriorityClass
from gpugate.core.residents import ResidentKey
from gpugate.core.units import GiB, MiB
from gpugate.runtimes.answers import Measured
from gpugate.runtimes.comfyui.envelope import LOWVRAM_WEIGHTS
from gpugate.runtimes.footprint import Cap, Cards, Elasticity, Footprint
from gpugate.runtimes.registry import runtime_for
from gpugate.runtimes.sections import load_config_text
from tests.sim.comfyui_helpers import flux

CONFIG = """\
consumers:
  ollama: {runtime: ollama, listen: 127.0.0.1:1, upstream: http://127.0.0.1:2}
  comfyui:
    runtime: comfyui
    listen: 127.0.0.1:3
    upstream: http://127.0.0.1:4
    comfyui:
      working_set: 0
      working_set_per_megapixel: 1GiB
      files:
        flux1-dev-fp8.safetensors: 11350MiB
        t5xxl_fp8_e4m3fn.safetensors: 4667MiB
        clip_l.safetensors: 235MiB
        ae.safetensors: 320MiB
  whisper:
    runtime: whisper
    listen: 127.0.0.1:5
    upstream: http://127.0.0.1:6
    envelope: 2050MiB
  vllm:
    runtime: vllm
    listen: 127.0.0.1:7
    upstream: http://127.0.0.1:8
    envelope: 13GiB
    control: {command: [vllm, serve, m, --gpu-memory-utilization, "0.6"]}
"""
CARD = Cards((16 * GiB,))


@pytest.fixture(scope="module")
def runtimes():
    config = load_config_text(CONFIG, "consumers.yaml")
    return {c.name: runtime_for(c) for c in config.consumers}


class Bounds:
    def measured_job(self, kind: ResidentKey) -> Measured | None:
        return None


def test_every_runtime_says_how_its_loads_take_memory(runtimes):
    kinds = {name: runtime.memory.elasticity for name, runtime in runtimes.items()}
    assert kinds == {
        "ollama": Elasticity.FIXED,
        "comfyui": Elasticity.FITTED,
        "whisper": Elasticity.FIXED,
        "vllm": Elasticity.SHARE,
    }
    assert runtimes["whisper"].memory.configured("models/x.bin") == 2050 * MiB
    assert runtimes["whisper"].memory.cap("models/x.bin", GiB, CARD) is None


def test_a_prompt_runs_in_its_largest_stage_and_takes_all_its_files_with_room(runtimes):
    comfy = runtimes["comfyui"]
    body = json.dumps({"prompt": flux()}).encode()
    classified = comfy.reading.classify("POST", "/prompt", body, "application/json")
    key = ResidentKey("comfyui", classified.model or "")
    found = comfy.memory.size(classified, key, PriorityClass.INTERACTIVE, Bounds())
    files = (11350 + 4667 + 235 + 320) * MiB
    # 1024x1024: one megapixel of working set.
    # Its floor: 128 MiB of each text encoder (its largest stage partly loaded), the working set.
    assert found == Footprint(files + GiB, 2 * LOWVRAM_WEIGHTS + GiB)
    assert found.degrades
    # No knob caps one load: --reserve-vram is kept free of the free memory, read at start.
    assert comfy.memory.cap("", 12 * GiB, CARD) is None


def test_vllm_takes_its_share_of_the_card_and_is_told_its_share(runtimes):
    vllm = runtimes["vllm"].memory
    assert vllm.read("m", CARD) == Footprint.fixed(int(16 * GiB * 0.6))
    assert vllm.read("m", Cards()) is None
    assert vllm.cap("m", 4 * GiB, CARD) == Cap(args=("--gpu-memory-utilization", "0.250"))
    assert vllm.configured("m") == 13 * GiB


def test_a_footprint_keeps_its_floor_within_its_ceiling():
    assert Footprint(5).floor == 5 and not Footprint(5).degrades
    with pytest.raises(ValueError, match="floor"):
        Footprint(5, 6)
