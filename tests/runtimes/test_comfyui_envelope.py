"""A ComfyUI prompt's VRAM: its files' sizes, the working set, the stage floor, measured peaks."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpugate.config.filesizes import DEFAULT_FILE_BYTES
from gpugate.config.model import Consumer
from gpugate.core.residents import ResidentKey
from gpugate.core.units import GiB, MiB
from gpugate.runtimes.comfyui.envelope import (
    LOWVRAM_WEIGHTS,
    EnvelopeSource,
    PromptEnvelope,
    PromptSizing,
    prompt_envelope,
    prompt_key,
)
from gpugate.runtimes.comfyui.graph import ModelFile, PromptDemand, read_prompt
from gpugate.runtimes.comfyui.settings import ComfyUISettings
from gpugate.runtimes.sections import load_config_text
from gpugate.store.db import MeasuredEnvelope
from tests.runtimes.comfyui_workflows import SD15, blank, body, flux, lora, txt2img, upscale

ROOT = Path(__file__).resolve().parents[2]
FLUX_WEIGHTS = (11350 + 4667 + 235 + 320) * MiB


def seed_comfyui() -> Consumer:
    """The worked example's comfyui consumer (its tokens' variables need not be set)."""
    text = (ROOT / "consumers.yaml").read_text()
    return load_config_text(text, ROOT / "consumers.yaml", {}).consumer("comfyui")


SEED = PromptSizing.of(seed_comfyui())


def demand(graph: object) -> PromptDemand:
    read = read_prompt(body(graph))
    assert isinstance(read, PromptDemand)
    return read


def test_the_sd15_workflow_from_the_worked_example() -> None:
    envelope = prompt_envelope(demand(txt2img(size=512)), SEED)
    working = GiB + GiB // 4  # 1 GiB, and 1 GiB per megapixel of a 512x512 latent
    # Its floor: the checkpoint partly on the card (ComfyUI's lowvram load) and the working set.
    assert envelope == PromptEnvelope(2034 * MiB + working, LOWVRAM_WEIGHTS + working,
                                      EnvelopeSource.FILES, working)  # fmt: skip


def test_the_flux_workflow_asks_for_all_its_files_and_runs_in_its_largest_stage() -> None:
    read = demand(flux())
    working = 2 * GiB  # 1 GiB, and 1 GiB for the 1024x1024 latent
    whole = prompt_envelope(read, SEED)
    assert (whole.bytes, whole.floor, whole.working_set) == (
        FLUX_WEIGHTS + working,
        # 128 MiB of each of the largest stage's models: the text encoders' two (t5xxl and
        # clip_l), beside the working set.
        2 * LOWVRAM_WEIGHTS + working,
        working,
    )


def test_a_model_free_graph_takes_the_working_set_only() -> None:
    envelope = prompt_envelope(demand(blank()), SEED)
    assert (envelope.bytes, envelope.floor, envelope.source) == (GiB, GiB, EnvelopeSource.FILES)


def test_lora_and_upscale_models_count_in_their_stages() -> None:
    sizing = PromptSizing.of(seed_comfyui())
    with_lora = prompt_envelope(demand(lora("detail.safetensors")), sizing)
    working = GiB + GiB // 4
    assert with_lora.bytes == 2034 * MiB + 300 * MiB + working
    assert with_lora.floor == 2 * LOWVRAM_WEIGHTS + working  # checkpoint and LoRA, partly
    sizing = PromptSizing(
        files=seed_comfyui().settings_as(ComfyUISettings).files
        + _sizes("upscale_models/*.pth: 64MiB")
    )
    upscaled = prompt_envelope(demand(upscale()), sizing)
    # The 64 MiB upscaler's stage is smaller than the checkpoint's 128 MiB partly loaded.
    assert (upscaled.bytes, upscaled.floor) == (2034 * MiB + 64 * MiB + GiB, LOWVRAM_WEIGHTS + GiB)


def _sizes(*lines: str) -> tuple:
    text = (
        "consumers:\n  c:\n    runtime: comfyui\n    listen: 1\n    upstream: http://127.0.0.1:2\n"
        "    files:\n" + "".join(f"      {line}\n" for line in lines)
    )
    return (
        load_config_text(text, Path("c.yaml"), {}).consumer("c").settings_as(ComfyUISettings).files
    )


@pytest.mark.parametrize(
    ("name", "size"),
    [
        ("flux1-dev-fp8.safetensors", 11350 * MiB),  # exact, with its folder
        ("flux1-dev-fp16.safetensors", round(11.9 * GiB)),  # the longer glob
        ("flux1-schnell.safetensors", 3 * GiB),  # the shorter glob
    ],
)
def test_globs_and_precedence_decide_a_files_size(name: str, size: int) -> None:
    files = _sizes(
        '"*.safetensors": 3GiB',
        "flux1-dev*.safetensors: 11.9GiB",
        "diffusion_models/flux1-dev-fp8.safetensors: 11350MiB",
    )
    read = PromptDemand((ModelFile("diffusion_models", name),), 0.0, name, ("9",))
    assert prompt_envelope(read, PromptSizing(files=files, working_set=0)).bytes == size


def test_a_file_nothing_sizes_makes_the_consumers_envelope_the_whole_prompt() -> None:
    graph = txt2img(ckpt="sdxl_base.safetensors")
    envelope = prompt_envelope(demand(graph), SEED)
    assert (envelope.bytes, envelope.floor, envelope.source, envelope.unsized) == (
        12 * GiB,
        12 * GiB,
        EnvelopeSource.ENVELOPE,
        (ModelFile("checkpoints", "sdxl_base.safetensors"),),
    )
    # Never less than what the sized files already take.
    small = PromptSizing(files=SEED.files, envelope=GiB)
    graph = flux()
    graph["3"]["inputs"]["vae_name"] = "other_vae.safetensors"
    assert prompt_envelope(demand(graph), small).bytes == 11350 * MiB + GiB


def test_without_an_envelope_an_unsized_file_counts_as_the_default() -> None:
    sizing = PromptSizing(files=SEED.files, envelope=None)
    graph = lora()
    graph["10"]["inputs"]["lora_name"] = ["50", 0]  # a name the graph does not write
    graph["50"] = {"class_type": "PrimitiveString", "inputs": {"value": "x"}}
    envelope = prompt_envelope(demand(graph), sizing)
    working = GiB  # the seed's per-megapixel setting is not in this sizing
    assert envelope.source is EnvelopeSource.DEFAULT
    assert envelope.unsized == (ModelFile("loras", None),)
    assert envelope.bytes == 2034 * MiB + DEFAULT_FILE_BYTES + working


def test_a_measured_peak_wins_over_configured_sizes() -> None:
    read = demand(flux())
    measured = prompt_envelope(read, SEED, 13 * GiB)
    assert (measured.bytes, measured.source) == (13 * GiB, EnvelopeSource.MEASURED)
    assert measured.floor == 2 * LOWVRAM_WEIGHTS + 2 * GiB  # partly loaded, as configured
    # Over an unsized file and the consumer's envelope too.
    graph = txt2img(ckpt="sdxl_base.safetensors")
    assert prompt_envelope(demand(graph), SEED, 7 * GiB).bytes == 7 * GiB
    # A larger latent than any measured run adds its part of the working set.
    bigger = prompt_envelope(read, SEED, 13 * GiB, measured_megapixels=0.25)
    assert bigger.bytes == 13 * GiB + 3 * GiB // 4
    assert prompt_envelope(read, SEED, 13 * GiB, measured_megapixels=4.0).bytes == 13 * GiB


def test_a_prompts_key_is_the_measured_envelopes_key() -> None:
    read = demand(flux())
    key = prompt_key("comfyui", read)
    assert key == ResidentKey("comfyui", read.key, "")
    stored = MeasuredEnvelope("comfyui", read.key, "", 13 * GiB)
    measured = {ResidentKey(stored.consumer, stored.model, stored.options): stored.bytes}
    assert prompt_envelope(read, SEED, measured.get(key)).bytes == 13 * GiB
    assert prompt_key("comfyui", demand(txt2img())) == ResidentKey("comfyui", SD15, "")
