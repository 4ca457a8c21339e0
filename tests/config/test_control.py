"""`control:` of a consumer: a runtime started and stopped as a process."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from gpugate.config.model import ProcessControlSettings
from gpugate.core.units import MiB
from tests.config.helpers import Found, errors, load, warnings


def whisper(control: str, envelope: str | None = "2050MiB") -> str:
    """A whisper consumer whose `control:` block starts on line 7."""
    text = textwrap.dedent("""\
        consumers:
          whisper:
            runtime: whisper
            listen: 0.0.0.0:8080
            upstream: http://127.0.0.1:8081
            processes: {commands: [whisper-server]}
        """)
    if envelope is not None:
        text = text.replace("runtime: whisper\n", f"runtime: whisper\n    envelope: {envelope}\n")
    return text + textwrap.indent(textwrap.dedent(control), "    ")


def test_a_unit_with_defaults() -> None:
    consumer = load(whisper("control: {unit: whisper-server.service}\n")).config.consumers[0]
    assert consumer.control == ProcessControlSettings(unit="whisper-server.service")
    assert consumer.control.health == "/health"
    assert (consumer.control.start_timeout, consumer.control.stop_timeout) == (60.0, 10.0)
    assert consumer.control.start_admission_timeout == 120.0
    assert consumer.envelope == 2050 * MiB


def test_a_command_with_env_cwd_and_timeouts() -> None:
    text = whisper("""\
        control:
          command: [whisper-server, -m, models/ggml-large-v3.bin, --port, "8081"]
          env: {WHISPER_ARG_DEVICE: 0, GGML_CUDA_NO_PINNED: "1", EMPTY: }
          cwd: /opt/whisper.cpp
          health: /health
          start_timeout: 90s
          stop_timeout: 5s
          start_admission_timeout: 3m
        """)
    control = load(text).config.consumers[0].control
    assert control == ProcessControlSettings(
        command=("whisper-server", "-m", "models/ggml-large-v3.bin", "--port", "8081"),
        env=(("WHISPER_ARG_DEVICE", "0"), ("GGML_CUDA_NO_PINNED", "1"), ("EMPTY", "")),
        cwd=Path("/opt/whisper.cpp"),
        start_timeout=90.0,
        stop_timeout=5.0,
        start_admission_timeout=180.0,
    )


@pytest.mark.parametrize(
    ("control", "found"),
    [
        (
            "control: {unit: w.service, command: [whisper-server]}\n",
            Found(8, "consumers.whisper.control",
                  "give either unit (a systemd service) or command, not both"),
        ),
        (
            "control: {health: /health}\n",
            Found(8, "consumers.whisper.control",
                  "give unit (a systemd service) or command (a list)"),
        ),
        (
            "control:\n  command: []\n",
            Found(9, "consumers.whisper.control.command",
                  "must be a non-empty list: the program first"),
        ),
        (
            "control:\n  command: whisper-server --port 8081\n",
            Found(9, "consumers.whisper.control.command",
                  "expected a list, got 'whisper-server --port 8081'"),
        ),
        (
            "control:\n  unit: w.service\n  cwd: /opt\n",
            Found(10, "consumers.whisper.control.cwd",
                  "applies to a command; a unit has its own Environment= and WorkingDirectory="),
        ),
        (
            "control:\n  command: [w]\n  env: {1BAD: x}\n",
            Found(10, "consumers.whisper.control.env.1BAD",
                  "'1BAD' is not a variable name (letters, digits, _)"),
        ),
        (
            "control:\n  command: [w]\n  health: health\n",
            Found(10, "consumers.whisper.control.health",
                  "expected a path like '/health', got 'health'"),
        ),
        (
            "control:\n  unit: w.service\n  start_admission_timeout: 0s\n",
            Found(10, "consumers.whisper.control.start_admission_timeout",
                  "must be longer than 0s"),
        ),
    ],
)  # fmt: skip
def test_control_errors_name_the_field_and_its_line(control: str, found: Found) -> None:
    assert errors(whisper(control)) == [found]


def test_a_process_controlled_consumer_needs_an_envelope() -> None:
    assert errors(whisper("control: {unit: whisper-server.service}\n", envelope=None)) == [
        Found(
            2,
            "consumers.whisper.envelope",
            "a process-controlled consumer needs an envelope: the bytes its start is admitted for",
        )
    ]


@pytest.mark.parametrize(
    ("runtime", "fields"),
    [
        ("ollama", ["listen: 0.0.0.0:11434", "processes: {units: [ollama.service]}"]),
        (
            "comfyui",
            [
                "listen: 0.0.0.0:8188",
                'processes: {commands: ["ComfyUI/main.py"]}',
                "envelope: 12GiB",
            ],
        ),
    ],
)
def test_a_control_on_a_server_the_gate_does_not_start_is_a_warning_at_its_line(
    runtime: str, fields: list[str]
) -> None:
    # Ollama and ComfyUI load and unload models inside a running server: nothing would read
    # the control, and no envelope is asked for one.
    lines = ["consumers:", f"  {runtime}:", f"    runtime: {runtime}"]
    lines += [f"    {field}" for field in [*fields, "upstream: http://127.0.0.1:9999"]]
    lines += ["    control:", f"      command: [{runtime}, serve]"]
    assert warnings("\n".join(lines) + "\n")[-1:] == [
        Found(
            len(lines) - 1,
            f"consumers.{runtime}.control",
            f"runtime {runtime} ignores control: the gate starts and stops only a runtime "
            "whose memory is its process's; its models load and unload inside its server, "
            "which you start (or systemd does)",
        )
    ]
