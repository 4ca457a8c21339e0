"""The simulated ComfyUI's memory rules: partial loads, --reserve-vram, Dynamic VRAM."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from gpugate.core.units import GiB, MiB
from gpugate_sim.comfyui.__main__ import command_parser, memory_overrides
from gpugate_sim.comfyui.memory import (
    DYNAMIC_HEADROOM,
    EXTRA_RESERVED_VRAM,
    INFERENCE_MEMORY,
    MemoryOptions,
    Part,
    TorchOutOfMemory,
    Vram,
)
from gpugate_sim.comfyui.server import comfyui_argv, memory_flags, memory_options
from gpugate_sim.comfyui.work import step_seconds
from gpugate_sim.device import SimulatedGpuHost
from gpugate_sim.scenario import ComfyUISpec, load_host
from tests.sim.comfyui_helpers import connect, kinds, make_comfy, queue, session
from tests.sim.processes import sleepers

__all__ = ["make_comfy", "session"]
UNET = Part("diffusion_models", "flux1-dev-fp8.safetensors", "model", 11350 * MiB)
CLIP = Part("text_encoders", "t5xxl_fp8_e4m3fn.safetensors+clip_l.safetensors", "clip", 4902 * MiB)
WORKING = 1 * GiB
FLUX_PROMPT = Path(__file__).resolve().parents[2] / "gpugate_sim/data/flux-prompt.json"


@pytest.fixture
def other(sim_host: SimulatedGpuHost) -> Iterator[int]:
    """A live process that holds the rest of the card's memory in these tests."""
    with sleepers(1) as [proc]:
        yield proc.pid
        sim_host.release(proc.pid)


def fill_to(sim_host: SimulatedGpuHost, pid: int, free: int) -> None:
    """Have `pid` hold what leaves `free` bytes on the card."""
    sim_host.allocate(pid, sim_host.free(0) - free, name="other")
    assert sim_host.free(0) == free


def vram(sim_host: SimulatedGpuHost, **options: object) -> Vram:
    return Vram(sim_host, 0, os.getpid(), options=MemoryOptions(**options))  # type: ignore[arg-type]


# -- options -------------------------------------------------------------------------------


def test_reserve_vram_is_gigabytes_times_1024_cubed_and_400_mib_without_it():
    assert memory_options(ComfyUISpec()).reserve == EXTRA_RESERVED_VRAM == 400 * MiB
    assert memory_options(ComfyUISpec(reserve_vram=1.5)).reserve == int(1.5 * GiB)
    options = memory_options(ComfyUISpec(reserve_vram=1.0))
    assert options.minimum_inference == INFERENCE_MEMORY + GiB
    assert options.simple_headroom == GiB  # Dynamic VRAM's simple headroom is the reserve
    assert memory_options(ComfyUISpec()).simple_headroom == DYNAMIC_HEADROOM


def test_command_line_memory_options_are_parsed_as_comfyui_parses_them():
    base = ["serve", "--host-file", "host.yaml", "--state-dir", "state"]
    args = command_parser().parse_args([*base, "--reserve-vram", "2.5", "--vram-headroom", "1"])
    assert memory_overrides(args) == {"reserve_vram": 2.5, "vram_headroom": 1.0}
    both = command_parser().parse_args([*base, "--disable-dynamic-vram", "--enable-dynamic-vram"])
    assert memory_overrides(both) == {"dynamic_vram": True}  # enables_dynamic_vram: enable wins
    off = command_parser().parse_args([*base, "--disable-dynamic-vram", "--disable-smart-memory"])
    assert memory_overrides(off) == {"dynamic_vram": False, "disable_smart_memory": True}
    with pytest.raises(SystemExit):
        command_parser().parse_args([*base, "--reserve-vram", "lots"])


def test_host_file_memory_fields_and_the_command_line_they_show(tmp_path: Path):
    host = tmp_path / "host.yaml"
    host.write_text("comfyui:\n  reserve_vram: 1\n  dynamic_vram: true\n  vram_headroom: 0.5\n")
    spec = load_host(host).comfyui
    assert spec is not None
    assert (spec.reserve_vram, spec.dynamic_vram, spec.vram_headroom) == (1.0, True, 0.5)
    assert comfyui_argv("127.0.0.1", 8188, None, memory_flags(spec))[-5:] == [
        "--reserve-vram", "1", "--enable-dynamic-vram", "--vram-headroom", "0.5",
    ]  # fmt: skip
    host.write_text("comfyui:\n  dynamic_vram: sometimes\n")
    with pytest.raises(ValueError, match=r"comfyui\.dynamic_vram: expected true or false"):
        load_host(host)


def test_a_partly_loaded_model_takes_its_offloaded_bytes_at_the_copy_rate_every_step():
    spec = ComfyUISpec(steps_per_second=4.0, offload_gib_per_second=8.0)
    assert step_seconds(spec, 0) == 0.25
    assert step_seconds(spec, 4 * GiB) == 0.25 + 0.5


# -- partial loads (lowvram) ---------------------------------------------------------------


async def test_a_model_that_does_not_fit_loads_as_far_as_the_reserve_and_working_set_allow(
    sim_host: SimulatedGpuHost, other: int
):
    fill_to(sim_host, other, 6 * GiB)
    memory = vram(sim_host)
    await memory.load([UNET], memory_required=WORKING, minimum_memory_required=WORKING)
    assert memory.loaded[UNET] == 6 * GiB - WORKING - EXTRA_RESERVED_VRAM
    assert memory.offloaded([UNET]) == UNET.size - memory.loaded[UNET]
    assert sim_host.free(0) == WORKING + EXTRA_RESERVED_VRAM
    async with memory.working_set(WORKING, {UNET}):
        assert sim_host.free(0) == EXTRA_RESERVED_VRAM
    memory.release_all()


async def test_reserve_vram_leaves_that_much_more_free(sim_host: SimulatedGpuHost, other: int):
    fill_to(sim_host, other, 6 * GiB)
    memory = vram(sim_host, reserve=2 * GiB, reserve_given=True)
    await memory.load([UNET], memory_required=WORKING, minimum_memory_required=WORKING)
    assert memory.loaded[UNET] == 6 * GiB - WORKING - 2 * GiB
    memory.release_all()


async def test_a_model_with_room_loads_whole(sim_host: SimulatedGpuHost, other: int):
    fill_to(sim_host, other, 13 * GiB)
    memory = vram(sim_host)
    await memory.load([UNET], memory_required=WORKING, minimum_memory_required=WORKING)
    assert memory.loaded[UNET] == UNET.size and memory.offloaded([UNET]) == 0
    memory.release_all()


async def test_below_comfyuis_minimum_of_128_mib_the_load_fails_and_holds_nothing(
    sim_host: SimulatedGpuHost, other: int
):
    fill_to(sim_host, other, 100 * MiB)
    memory = vram(sim_host)
    with pytest.raises(
        TorchOutOfMemory, match=r"^CUDA out of memory\. Tried to allocate 128\.00 MiB"
    ):
        await memory.load([CLIP])
    assert memory.loaded == {}
    assert sim_host.read().held_by(os.getpid(), 0) == 0
    assert [oom.requested for oom in sim_host.ooms()] == [128 * MiB]


async def test_another_model_is_unloaded_only_as_far_as_the_load_needs(
    sim_host: SimulatedGpuHost, other: int
):
    fill_to(sim_host, other, 8 * GiB)
    memory = vram(sim_host)
    await memory.load([CLIP])
    assert memory.loaded[CLIP] == CLIP.size
    vae = Part("vae", "ae.safetensors", "vae", 2 * GiB)
    await memory.load([vae])
    # free_memory(1.1 × 2 GiB + minimum_inference_memory): the text encoders lose what is
    # missing of that and keep the rest (smart memory's partial unload).
    needed = int(vae.size * 1.1) + INFERENCE_MEMORY + EXTRA_RESERVED_VRAM
    assert memory.loaded[CLIP] == CLIP.size - (needed - (8 * GiB - CLIP.size))
    assert memory.loaded[vae] == vae.size
    memory.release_all()


async def test_without_smart_memory_other_models_are_unloaded_whole(
    sim_host: SimulatedGpuHost, other: int
):
    fill_to(sim_host, other, 8 * GiB)
    memory = vram(sim_host, smart_memory=False)
    await memory.load([CLIP])
    await memory.load([Part("vae", "ae.safetensors", "vae", 2 * GiB)])
    assert CLIP not in memory.loaded
    memory.release_all()


# -- Dynamic VRAM ----------------------------------------------------------------------------


async def test_dynamic_vram_grows_into_free_memory_and_backs_off_under_pressure(
    sim_host: SimulatedGpuHost, other: int
):
    fill_to(sim_host, other, 8 * GiB)
    headroom = GiB
    memory = vram(sim_host, dynamic=True, headroom=headroom)
    await memory.load([UNET])
    # Weights fault in while the card keeps aimdo's 256 MiB and --vram-headroom free.
    assert memory.loaded[UNET] == 8 * GiB - DYNAMIC_HEADROOM - headroom
    assert sim_host.free(0) == DYNAMIC_HEADROOM + headroom
    # Another program takes 1 GiB of what was left free: at the next check the deficit is
    # paid by evicting weights, and the free memory is back at the headroom.
    sim_host.allocate(other, GiB, name="other")
    memory.pressure({UNET})
    assert memory.loaded[UNET] == 7 * GiB - DYNAMIC_HEADROOM - headroom
    assert sim_host.free(0) == DYNAMIC_HEADROOM + headroom
    # It gives that memory back: the weights fault in again.
    sim_host.release(other, 2 * GiB)
    memory.pressure({UNET})
    assert memory.loaded[UNET] == 9 * GiB - DYNAMIC_HEADROOM - headroom
    assert sim_host.ooms() == []
    memory.release_all()


async def test_dynamic_vram_faults_back_a_model_pressure_had_evicted_whole(
    sim_host: SimulatedGpuHost, other: int
):
    fill_to(sim_host, other, 4 * GiB)
    headroom = 2 * GiB
    memory = vram(sim_host, dynamic=True, headroom=headroom)
    await memory.load([CLIP])
    resident = 4 * GiB - DYNAMIC_HEADROOM - headroom
    assert memory.loaded[CLIP] == resident
    # Another program takes more than the headroom it was left: every byte of the text
    # encoders goes, and the card is back at the headroom.
    sim_host.allocate(other, headroom, name="other")
    memory.pressure({CLIP})
    assert CLIP not in memory.loaded
    assert sim_host.free(0) == DYNAMIC_HEADROOM + resident
    sim_host.release(other, headroom)
    memory.pressure({CLIP})
    assert memory.loaded[CLIP] == resident
    memory.release_all()


async def test_dynamic_vram_evicts_weights_for_the_working_set_instead_of_failing(
    sim_host: SimulatedGpuHost, other: int
):
    fill_to(sim_host, other, 6 * GiB)
    memory = vram(sim_host, dynamic=True)
    await memory.load([UNET])
    before = memory.loaded[UNET]
    async with memory.working_set(2 * GiB, {UNET}):
        assert memory.loaded[UNET] < before
        assert sim_host.free(0) >= DYNAMIC_HEADROOM
    assert sim_host.ooms() == []
    memory.release_all()


async def test_dynamic_vram_keeps_its_own_use_below_the_total_less_the_reserve(
    sim_host: SimulatedGpuHost, other: int
):
    # An empty 16 GiB card: the simple headroom (--reserve-vram 6) is what binds.
    memory = vram(sim_host, dynamic=True, reserve=6 * GiB, reserve_given=True)
    big = Part("diffusion_models", "big.safetensors", "model", 14 * GiB)
    await memory.load([big])
    assert memory.torch_reserved == 16 * GiB - 6 * GiB
    memory.release_all()


# -- through the server ----------------------------------------------------------------------


def clip_l_only() -> dict[str, object]:
    """The demo's FLUX graph with one text encoder: UNet, clip_l and ae."""
    prompt = json.loads(FLUX_PROMPT.read_text())["prompt"]
    prompt["2"] = {
        "class_type": "CLIPLoader",
        "inputs": {"clip_name": "clip_l.safetensors", "type": "stable_diffusion"},
    }
    return prompt


@pytest.mark.parametrize("graph", ["demo", "clip_l"])
async def test_the_demos_flux_graph_renders_partly_loaded_beside_whisper_and_an_ollama_model(
    make_comfy, session: aiohttp.ClientSession, sim_host: SimulatedGpuHost, other: int, graph: str
):
    # The demo's card: whisper-server warm (2,050 MiB), mVoice (292 MiB) and qwen2.5:7b's
    # runner (5,047 MiB), ComfyUI started as `gpugate init` writes it, --reserve-vram 1.
    sim_host.allocate(other, (2050 + 292 + 5047) * MiB, name="other")
    comfy = await make_comfy(reserve_vram=1.0, offload_gib_per_second=1e6)
    free = sim_host.free(0)
    prompt = json.loads(FLUX_PROMPT.read_text())["prompt"] if graph == "demo" else clip_l_only()
    socket = await connect(session, comfy.url, "me")
    prompt_id = await queue(session, comfy.url, prompt, client_id="me")
    await socket.until("progress")
    # The text encoders made way; the UNet has what the 1 GiB working set and the 1 GiB
    # reserve leave, its other 5 GiB stay in CPU RAM.
    assert comfy.vram.loaded[UNET] == free - WORKING - GiB < UNET.size
    events = await socket.until_done(prompt_id)
    assert "execution_success" in kinds(events) and "execution_error" not in kinds(events)
    assert sim_host.ooms() == []
