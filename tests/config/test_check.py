"""`gpugate check`, the seed consumers.yaml, and the manual that describes them."""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
from pathlib import Path

import attrs
import pytest

from gpugate.config import addresses, consumer, model
from gpugate.config.check import EXIT_INVALID, EXIT_OK, run_check
from gpugate.config.fields import yaml_key
from gpugate.core.classes import PriorityClass, ResidencyPolicy
from gpugate.core.units import GiB, MiB
from gpugate.runtimes.comfyui.settings import ComfyUISettings
from gpugate.runtimes.sections import RUNTIME_TABLE, load_config
from tests.config.helpers import ollama

ROOT = Path(__file__).resolve().parents[2]
SEED = ROOT / "consumers.yaml"
MANUAL = ROOT / "docs" / "configuration.md"


def gpugate_check(
    *args: str, cwd: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """`gpugate check ARGS` as a child process, with no GPUGATE_* variables but `env`'s."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith("GPUGATE_")}
    environ.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "gpugate", "check", *args],
        cwd=cwd,
        env=environ,
        capture_output=True,
        text=True,
        timeout=60,
    )


def _line_of(text: str, needle: str) -> int:
    return next(n for n, line in enumerate(text.splitlines(), 1) if needle in line)


def test_the_seed_file_passes_check_with_no_environment() -> None:
    result = gpugate_check("consumers.yaml", cwd=ROOT)
    seed = SEED.read_text()
    batch, ops = _line_of(seed, "env:GPUGATE_BATCH_TOKEN"), _line_of(seed, "env:GPUGATE_OPS_TOKEN")
    assert result.returncode == EXIT_OK
    assert result.stderr == (
        f"consumers.yaml:{batch}: identities[1].tokens[0]: warning: "
        "environment variable GPUGATE_BATCH_TOKEN is not set\n"
        f"consumers.yaml:{ops}: identities[2].tokens[0]: warning: "
        "environment variable GPUGATE_OPS_TOKEN is not set\n"
    )
    assert result.stdout == (
        "consumers.yaml: ok — 4 consumers (ollama, comfyui, whisper, mvoice), "
        "2 external services, 3 identities, reserve 1.0 GiB, 2 warnings\n"
    )


def test_the_seed_file_passes_check_cleanly_with_its_secrets_set() -> None:
    tokens = {"GPUGATE_BATCH_TOKEN": "batch-token", "GPUGATE_OPS_TOKEN": "ops-token"}
    result = gpugate_check("consumers.yaml", cwd=ROOT, env=tokens)
    assert (result.returncode, result.stderr) == (EXIT_OK, "")
    assert result.stdout == (
        "consumers.yaml: ok — 4 consumers (ollama, comfyui, whisper, mvoice), "
        "2 external services, 3 identities, reserve 1.0 GiB\n"
    )


def test_the_seed_file_describes_the_host(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("GPUGATE_BATCH_TOKEN", "GPUGATE_OPS_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    config = load_config(SEED)
    assert [g.index for g in config.gpus] == [0]
    assert (config.budget.reserve, config.budget.reserve_max) == (GiB, 2 * GiB)
    assert config.budget.sample_interval == 0.5
    assert [c.priority for c in config.classes] == PriorityClass.ordered()

    ollama_ = config.consumer("ollama")
    assert ollama_.runtime == "ollama" and ollama_.listen.port == 11434
    assert ollama_.residency.idle_ttl == 15 * 60
    gemma, bge = ollama_.model("gemma3:12b"), ollama_.model("bge-m3")
    assert gemma is not None and bge is not None
    assert gemma.envelope is not None and 7 * GiB < gemma.envelope < 8 * GiB
    assert (bge.envelope, bge.priority) == (1216348160, PriorityClass.BACKGROUND)
    assert bge.residency is not None and bge.residency.idle_ttl == 901

    comfyui = config.consumer("comfyui")
    assert comfyui.residency.policy is ResidencyPolicy.LOAD_ON_DEMAND
    assert comfyui.envelope == 12 * GiB
    sizing = comfyui.settings_as(ComfyUISettings)
    assert sizing.file_size("diffusion_models", "flux1-dev-fp8.safetensors") == 11350 * MiB
    assert sizing.file_size("unet", "flux1-dev-fp8.safetensors") == 11350 * MiB
    assert sizing.file_size("text_encoders", "t5xxl_fp8_e4m3fn.safetensors") == 4667 * MiB
    assert sizing.file_size("clip", "clip_l.safetensors") == 235 * MiB
    assert sizing.file_size("vae", "ae.safetensors") == 320 * MiB
    assert sizing.file_size("checkpoints", "v1-5-pruned-emaonly-fp16.safetensors") == 2034 * MiB
    assert sizing.file_size("diffusion_models", "flux1-dev.safetensors") == round(11.9 * GiB)
    assert sizing.file_size("loras", "detail.safetensors") == 300 * MiB
    assert sizing.file_size("checkpoints", "sdxl.safetensors") is None  # the envelope's
    assert (sizing.working_set, sizing.working_set_per_megapixel) == (GiB, GiB)
    assert comfyui.preempt == ()
    whisper = config.consumer("whisper")
    assert (whisper.residency.policy, whisper.envelope) == (
        ResidencyPolicy.ALWAYS_WARM,
        2050 * MiB,
    )
    assert config.consumer("mvoice").runtime == "http"
    assert all(c.upstream.is_loopback and not c.processes.empty for c in config.consumers)

    assert [e.name for e in config.external] == ["plex", "tdarr"]
    by_name = {i.name: i for i in config.identities}
    assert by_name["batch"].tokens == ()  # its variable is not set: warned and left out
    assert by_name["ops"].priority is PriorityClass.PRODUCTION


def test_an_invalid_file_exits_78_with_every_error(tmp_path: Path) -> None:
    (tmp_path / "consumers.yaml").write_text(
        ollama(residency="{ttl: forever}", gpu="yes", upstream="http://10.1.1.1:11435")
    )
    result = gpugate_check("consumers.yaml", cwd=tmp_path)
    assert (result.returncode, result.stdout) == (EXIT_INVALID, "")
    assert result.stderr.splitlines() == [
        "consumers.yaml:7: consumers.ollama.residency.ttl: "
        "expected a duration like '15m', got 'forever'",
        "consumers.yaml:8: consumers.ollama.gpu: expected a whole number, got yes (a boolean)",
    ]


def test_warnings_go_to_stderr_and_the_file_passes(tmp_path: Path) -> None:
    path = tmp_path / "gate.yaml"
    path.write_text(ollama(upstream="http://10.1.1.1:11435"))
    result = gpugate_check(str(path), cwd=tmp_path)
    assert result.returncode == EXIT_OK
    assert result.stderr.splitlines() == [
        f"{path}:5: consumers.ollama.upstream: warning: 10.1.1.1 is not a loopback address: "
        "clients could bypass the gate by talking to it directly"
    ]
    assert result.stdout == (
        f"{path}: ok — 1 consumer (ollama), 0 external services, 0 identities, "
        "reserve 1.0 GiB, 1 warning\n"
    )


def test_a_missing_file_exits_78(tmp_path: Path) -> None:
    result = gpugate_check("absent.yaml", cwd=tmp_path)
    assert (result.returncode, result.stdout, result.stderr) == (
        EXIT_INVALID,
        "",
        "gpugate check: absent.yaml: no such file\n",
    )


def test_without_a_file_check_reads_gpugate_config(tmp_path: Path) -> None:
    path = tmp_path / "elsewhere.yaml"
    path.write_text(ollama())
    result = gpugate_check(cwd=tmp_path, env={"GPUGATE_CONFIG": str(path)})
    assert result.returncode == EXIT_OK
    assert result.stdout.startswith(f"{path}: ok — 1 consumer (ollama), ")


def test_the_summary_counts_in_words(tmp_path: Path) -> None:
    path = tmp_path / "consumers.yaml"
    path.write_text(
        ollama()
        + "external:\n  plex: {processes: {commands: [Plex Transcoder]}}\n"
        + "identities:\n  - {name: lan, class: interactive, sources: [10.0.0.0/8]}\n"
        + "budget: {reserve: 1536MiB}\n"
    )
    out, err = io.StringIO(), io.StringIO()
    assert run_check(path, out, err, runtimes=RUNTIME_TABLE) == EXIT_OK
    assert err.getvalue() == ""
    assert out.getvalue() == (
        f"{path}: ok — 1 consumer (ollama), 1 external service, 1 identity, reserve 1.5 GiB\n"
    )


def test_the_manual_names_every_field() -> None:
    manual = MANUAL.read_text()
    classes = [
        value
        for module in (model, consumer, addresses)
        for value in vars(module).values()
        if isinstance(value, type) and attrs.has(value) and value.__module__ == module.__name__
    ]
    assert model.Consumer in classes and model.Config in classes
    # A runtime's section is written under the runtime's name, with its own fields.
    sections = {e.name: e.section for e in RUNTIME_TABLE.entries if attrs.fields(e.section)}
    classes += list(sections.values())
    missing = [
        f"{cls.__name__}.{name}"
        for cls in classes
        for field in attrs.fields(cls)
        for name in (
            set(sections) if "section_of" in field.metadata else {field.name, yaml_key(field)}
        )
        if f"`{name}`" not in manual and f"`{name}:`" not in manual
    ]
    assert missing == []


def test_the_manuals_example_is_what_check_prints(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    manual = MANUAL.read_text()
    example = re.search(r"For this file:\n\n```yaml\n(.*?)```\n\n```\n(.*?)```", manual, re.S)
    assert example is not None, "the manual's check example is missing"
    session = example.group(2).splitlines()
    assert session[0] == "$ gpugate check consumers.yaml" and session[-2] == "$ echo $?"
    (tmp_path / "consumers.yaml").write_text(example.group(1))
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("GPUGATE_BATCH_TOKEN", raising=False)
    out, err = io.StringIO(), io.StringIO()
    assert run_check(Path("consumers.yaml"), out, err, runtimes=RUNTIME_TABLE) == int(session[-1])
    assert out.getvalue() == ""
    assert err.getvalue().splitlines() == session[1:-2]
