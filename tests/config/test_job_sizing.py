"""A job runtime's sizing in consumers.yaml: files by name or glob, working set, preempt."""

from __future__ import annotations

import pytest

from gpugate.config.filesizes import FilePattern
from gpugate.config.model import Consumer, FileSize
from gpugate.core.classes import PriorityClass
from gpugate.core.units import GiB, MiB
from gpugate.runtimes.comfyui.settings import ComfyUISettings
from tests.config.helpers import Found, errors, load, warnings


def comfy(consumer: Consumer) -> ComfyUISettings:
    return consumer.settings_as(ComfyUISettings)


COMFYUI = {
    "runtime": "comfyui",
    "listen": "0.0.0.0:8188",
    "upstream": "http://127.0.0.1:8189",
    "processes": "{commands: [ComfyUI/main.py]}",
}


def comfyui(*more: str, **fields: str) -> str:
    """A file with one `comfyui` consumer: lines 1-2 `consumers:`/`comfyui:`, then runtime (3),
    listen (4), upstream (5), processes (6), `fields` from line 7 and `more` lines after them
    (already indented for the consumer's keys)."""
    values = {**COMFYUI, **fields}
    lines = [f"    {key}: {value}\n" for key, value in values.items()]
    return "consumers:\n  comfyui:\n" + "".join(lines) + "".join(f"{m}\n" for m in more)


FILES = (
    "    files:",
    "      flux1-dev-fp8.safetensors: 11350MiB",
    "      flux1-dev*.safetensors: 11.9GiB",
    '      "*.safetensors": 2GiB',
    "      diffusion_models/*: 12GiB",
    "      unet/flux1-schnell.safetensors: 11GiB",
    "      loras/[a-m]*.safetensors: 150MiB",
)


def test_files_working_set_and_preempt_are_read() -> None:
    text = comfyui(
        *FILES,
        working_set="1536MiB",
        working_set_per_megapixel="1GiB",
        preempt="[production]",
    )
    consumer = load(text).config.consumer("comfyui")
    assert comfy(consumer).files[0] == FileSize(
        FilePattern(None, "flux1-dev-fp8.safetensors"), 11350 * MiB
    )
    assert comfy(consumer).files[3] == FileSize(FilePattern("diffusion_models", "*"), 12 * GiB)
    # The legacy folder name is read as ComfyUI reads it.
    assert comfy(consumer).files[4].pattern == FilePattern(
        "diffusion_models", "flux1-schnell.safetensors"
    )
    assert (comfy(consumer).working_set, comfy(consumer).working_set_per_megapixel) == (
        1536 * MiB,
        GiB,
    )
    assert consumer.preempt == (PriorityClass.PRODUCTION,)


def test_the_defaults_of_a_job_runtime() -> None:
    consumer = load(comfyui(envelope="12GiB")).config.consumer("comfyui")
    assert (comfy(consumer).files, consumer.preempt) == ((), ())
    assert (comfy(consumer).working_set, comfy(consumer).working_set_per_megapixel) == (GiB, 0)


@pytest.mark.parametrize(
    ("folder", "name", "size"),
    [
        # An exact name beats every glob, however long.
        ("diffusion_models", "flux1-dev-fp8.safetensors", 11350 * MiB),
        # Between globs, more literal characters win: flux1-dev* over diffusion_models/*.
        ("diffusion_models", "flux1-dev-fp16.safetensors", round(11.9 * GiB)),
        ("checkpoints", "flux1-dev-nf4.safetensors", round(11.9 * GiB)),
        # diffusion_models/* (no literal name characters) against *.safetensors (12).
        ("diffusion_models", "hidream.safetensors", 2 * GiB),
        ("diffusion_models", "hidream.gguf", 12 * GiB),
        # An exact name with a folder only matches in that folder; `unet` is diffusion_models.
        ("unet", "flux1-schnell.safetensors", 11 * GiB),
        ("checkpoints", "flux1-schnell.safetensors", 2 * GiB),
        ("loras", "detail.safetensors", 150 * MiB),
        ("loras", "style.safetensors", 2 * GiB),
        # `*` crosses subfolders, as ComfyUI lists them ("SDXL/x.safetensors").
        ("checkpoints", "SDXL/juggernaut.safetensors", 2 * GiB),
        ("checkpoints", "model.ckpt", None),
    ],
)
def test_the_most_specific_size_wins(folder: str, name: str, size: int | None) -> None:
    consumer = load(comfyui(*FILES)).config.consumer("comfyui")
    assert comfy(consumer).file_size(folder, name) == size


def test_on_a_tie_a_folder_wins_then_the_first_written() -> None:
    text = comfyui(
        "    files:",
        "      a*.safetensors: 1GiB",
        "      vae/a*.safetensors: 2GiB",
        "      b*.safetensors: 3GiB",
        "      b*.safetensorz: 4GiB",
        "      ?b*.safetensors: 5GiB",
    )
    consumer = load(text).config.consumer("comfyui")
    assert comfy(consumer).file_size("vae", "ae.safetensors") == 2 * GiB
    assert comfy(consumer).file_size("checkpoints", "ae.safetensors") == GiB
    assert comfy(consumer).file_size("vae", "bb.safetensors") == 3 * GiB


def test_bad_patterns_and_sizes_are_errors_at_their_line() -> None:
    text = comfyui(
        "    files:",
        "      ok.safetensors: 1GiB",
        "      flux[12.safetensors: 1GiB",
        "      loras/: 1GiB",
        "      ae.safetensors: lots",
        "      clip_l.safetensors:",
        "      vae/ae.safetensors: -1",
        "      'dir\\x.safetensors': 1GiB",
        "      a//b: 1GiB",
    )
    assert errors(text) == [
        Found(
            9,
            "consumers.comfyui.files.flux[12.safetensors",
            "unclosed '[' in 'flux[12.safetensors' (write '[[]' for a literal '[')",
        ),
        Found(
            10,
            "consumers.comfyui.files.loras/",
            "expected a file name after the folder in 'loras/'",
        ),
        Found(
            11,
            "consumers.comfyui.files.ae.safetensors",
            "expected a size like '7.5GiB', got 'lots'",
        ),
        Found(
            12, "consumers.comfyui.files.clip_l.safetensors", "'clip_l.safetensors' needs a value"
        ),
        Found(
            13, "consumers.comfyui.files.vae/ae.safetensors", "a size cannot be negative, got -1"
        ),
        Found(
            14,
            "consumers.comfyui.files.dir\\x.safetensors",
            "write '/' between folders, not '\\', in 'dir\\\\x.safetensors'",
        ),
        Found(
            15, "consumers.comfyui.files.a//b", "expected a file name after the folder in 'a//b'"
        ),
    ]


def test_a_pattern_given_twice_under_its_legacy_folder_is_an_error() -> None:
    text = comfyui(
        "    files:",
        "      diffusion_models/flux.safetensors: 11GiB",
        "      unet/flux.safetensors: 12GiB",
    )
    assert errors(text) == [
        Found(
            9,
            "consumers.comfyui.files.unet/flux.safetensors",
            "'diffusion_models/flux.safetensors' is given twice (first at line 8)",
        )
    ]


def test_files_must_be_a_mapping_and_preempt_a_list_of_classes() -> None:
    assert errors(comfyui(files="[ae.safetensors]", preempt="[urgent]")) == [
        Found(7, "consumers.comfyui.files", "expected a mapping of entries by name, got a list"),
        Found(
            8,
            "consumers.comfyui.preempt[0]",
            "unknown priority class 'urgent' (one of production, interactive, background, "
            "benchmark, maintenance)",
        ),
    ]


def test_a_comfyui_consumer_with_no_sizes_is_warned() -> None:
    assert warnings(comfyui()) == [
        Found(
            2,
            "consumers.comfyui",
            "no files and no envelope: every model file a prompt loads counts as 8.0 GiB "
            "(give their sizes in files)",
        )
    ]
    assert warnings(comfyui(envelope="12GiB")) == []
    assert warnings(comfyui(*FILES)) == []


def test_job_fields_elsewhere_are_warned_and_a_class_listed_twice() -> None:
    text = comfyui(envelope="12GiB", preempt="[production, production]") + (
        "  whisper:\n    runtime: whisper\n    listen: 8080\n    upstream: http://127.0.0.1:8081\n"
        "    processes: {commands: [whisper-server]}\n"
        "    working_set: 1GiB\n    files: {a.bin: 1GiB}\n    preempt: []\n"
    )
    assert warnings(text) == [
        Found(8, "consumers.comfyui.preempt[1]", "production is listed twice"),
        Found(
            14,
            "consumers.whisper.working_set",
            "only a comfyui consumer reads working_set; runtime whisper ignores it",
        ),
        Found(
            15,
            "consumers.whisper.files",
            "only a comfyui consumer reads files; runtime whisper ignores it",
        ),
        Found(
            16,
            "consumers.whisper.preempt",
            "only a comfyui consumer reads preempt; runtime whisper ignores it",
        ),
    ]
