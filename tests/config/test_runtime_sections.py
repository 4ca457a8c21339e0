"""A runtime's own settings live in its section of a consumer (`comfyui:`, `ollama:`,
`vllm:`), of the type its package registers; the older spelling at the consumer's top
level still reads the same."""

from __future__ import annotations

from gpugate.core.units import GiB, MiB
from gpugate.runtimes.comfyui.settings import ComfyUISettings
from gpugate.runtimes.ollama.settings import OllamaSettings
from gpugate.runtimes.sections import RUNTIME_TABLE
from gpugate.runtimes.vllm.settings import VllmSettings
from tests.config.helpers import Found, errors, load, warnings

HEAD = """\
consumers:
  comfy:
    runtime: comfyui
    listen: 0.0.0.0:8188
    upstream: http://127.0.0.1:8189
    processes: {commands: [ComfyUI/main.py]}
    envelope: 12GiB
"""


def comfy(text: str) -> ComfyUISettings:
    return load(text).config.consumer("comfy").settings_as(ComfyUISettings)


def test_a_section_is_read_as_the_runtimes_own_settings():
    settings = comfy(
        HEAD
        + "    comfyui:\n"
        + "      working_set: 1536MiB\n"
        + "      validate_prompts: false\n"
        + "      cors_header: '*'\n"
        + "      files: {ae.safetensors: 320MiB}\n"
    )
    assert type(settings) is ComfyUISettings
    assert (settings.working_set, settings.validate_prompts, settings.cors_header) == (
        1536 * MiB,
        False,
        "*",
    )
    assert settings.file_size("vae", "ae.safetensors") == 320 * MiB


def test_the_top_level_spelling_reads_the_same():
    section = comfy(HEAD + "    comfyui: {working_set: 2GiB, validate_prompts: false}\n")
    flat = comfy(HEAD + "    working_set: 2GiB\n    validate_prompts: false\n")
    assert section == flat == ComfyUISettings(working_set=2 * GiB, validate_prompts=False)
    assert comfy(HEAD) == ComfyUISettings()


def test_a_setting_given_twice_is_an_error_naming_both_places():
    text = HEAD + "    working_set: 2GiB\n    comfyui:\n      working_set: 3GiB\n"
    assert errors(text) == [
        Found(
            10,
            "consumers.comfy.comfyui.working_set",
            "also given as consumers.comfy.working_set (line 8): give it once",
        )
    ]


def test_an_error_inside_a_section_names_its_line_and_path():
    text = HEAD + "    comfyui:\n      working_sets: 2GiB\n"
    assert errors(text) == [
        Found(
            9,
            "consumers.comfy.comfyui.working_sets",
            "unknown key 'working_sets'; did you mean 'working_set'?",
        )
    ]
    assert errors(HEAD + "    comfyui: {working_set: lots}\n")[0].path == (
        "consumers.comfy.comfyui.working_set"
    )


def test_another_runtimes_section_or_setting_is_a_warning():
    text = HEAD + "    vllm: {sleep_level: 2}\n    origins: ['https://x.example']\n"
    assert warnings(text) == [
        Found(8, "consumers.comfy.vllm", "only a vllm consumer reads a vllm section; "
              "runtime comfyui ignores it"),
        Found(9, "consumers.comfy.origins", "only an ollama consumer reads origins; "
              "runtime comfyui ignores it"),
    ]  # fmt: skip
    assert comfy(text) == ComfyUISettings()


def test_an_unknown_key_is_hinted_with_the_runtimes_settings():
    (found,) = errors(HEAD + "    colour: red\n")
    assert found.path == "consumers.comfy.colour"
    for key in ("files", "working_set", "validate_prompts", "cors_header", "comfyui"):
        assert key in found.message


def test_ollama_and_vllm_sections():
    text = """\
consumers:
  ollama:
    runtime: ollama
    listen: 0.0.0.0:11434
    upstream: http://127.0.0.1:11435
    processes: {units: [ollama.service]}
    ollama:
      origins: ["https://app.example"]
  vllm:
    runtime: vllm
    listen: 0.0.0.0:8000
    upstream: http://127.0.0.1:8001
    processes: {names: [vllm]}
    envelope: 8GiB
    vllm: {sleep_level: 2}
"""
    config = load(text).config
    assert config.consumer("ollama").settings == OllamaSettings(origins=("https://app.example",))
    assert config.consumer("vllm").settings_as(VllmSettings).sleep_level == 2
    bad = text.replace("sleep_level: 2", "sleep_level: 3")
    assert errors(bad) == [
        Found(15, "consumers.vllm.vllm.sleep_level", "expected 1 or 2 (vLLM's sleep levels), got 3")
    ]


def test_an_unknown_runtime_names_every_registered_one():
    (found,) = errors(HEAD.replace("runtime: comfyui", "runtime: sdnext"))
    assert found.path == "consumers.comfy.runtime"
    for name in RUNTIME_TABLE.names:
        assert name in found.message
