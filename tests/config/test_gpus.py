"""A consumer on several GPUs (`gpus:`): who may have several, and how they are checked."""

from __future__ import annotations

from tests.config.helpers import Found, errors, load, ollama

WHISPER = (
    "  whisper:\n"  # line 7 after ollama()
    "    runtime: whisper\n"
    "    listen: 0.0.0.0:8080\n"
    "    upstream: http://127.0.0.1:8081\n"  # 10
    "    envelope: 2GiB\n"
    "    processes: {names: [whisper-server]}\n"
    "    gpus: [0, 1]\n"  # 13
)


def test_ollama_may_use_several_gpus() -> None:
    consumer = load(ollama(gpus="[1, 0]")).config.consumer("ollama")
    assert consumer.cards == (1, 0)
    assert load(ollama()).config.consumer("ollama").cards == (0,)
    assert load(ollama(gpu="2")).config.consumer("ollama").cards == (2,)


def test_gpu_and_gpus_together_is_an_error_naming_both() -> None:
    assert errors(ollama(gpu="0", gpus="[0, 1]")) == [
        Found(
            8,
            "consumers.ollama.gpus",
            "give gpu (one GPU) or gpus (several), not both; gpu is at consumers.ollama.gpu "
            "(line 7)",
        )
    ]


def test_a_gpu_listed_twice_or_empty_or_negative() -> None:
    assert errors(ollama(gpus="[0, 1, 0]")) == [
        Found(7, "consumers.ollama.gpus[2]", "GPU 0 is listed twice")
    ]
    assert errors(ollama(gpus="[]")) == [
        Found(7, "consumers.ollama.gpus", "must list at least one GPU index")
    ]
    assert [f.path for f in errors(ollama(gpus="[-1]"))] == ["consumers.ollama.gpus[0]"]


def test_each_gpu_must_be_one_the_budget_lists() -> None:
    text = "gpus:\n  - index: 0\n  - index: 1\n" + ollama(gpus="[0, 2]")
    assert errors(text) == [
        Found(10, "consumers.ollama.gpus[1]", "GPU 2 is not in gpus (listed: 0, 1)")
    ]


def test_a_process_the_gate_starts_may_use_several_gpus() -> None:
    text = ollama() + WHISPER + "    control:\n      command: [whisper-server, -m, x.bin]\n"
    assert load(text).config.consumer("whisper").cards == (0, 1)


def test_a_process_the_gate_does_not_start_takes_one_gpu() -> None:
    found = errors(ollama() + WHISPER)
    assert [(f.line, f.path) for f in found] == [(13, "consumers.whisper.gpus")]
    assert "the gate does not start it" in found[0].message
    unit = ollama() + WHISPER + "    control:\n      unit: whisper.service\n"
    found = errors(unit)
    assert [f.path for f in found] == ["consumers.whisper.gpus"]
    assert "Environment=CUDA_VISIBLE_DEVICES" in found[0].message


def test_comfyui_runs_on_one_device() -> None:
    text = ollama() + (
        "  comfyui:\n"
        "    runtime: comfyui\n"
        "    listen: 0.0.0.0:8188\n"
        "    upstream: http://127.0.0.1:8189\n"
        "    processes: {commands: [ComfyUI/main.py]}\n"
        "    envelope: 8GiB\n"
        "    gpus: [0, 1]\n"  # 13
    )
    assert errors(text) == [
        Found(
            13,
            "consumers.comfyui.gpus",
            "runtime comfyui runs on one device: give one gpu, not several",
        )
    ]
