"""`gpugate share`: where the packaged files are (gpugate.packaged), each one there."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from gpugate import cli
from gpugate.commands.exits import Exit
from gpugate.packaged import GATE_UNIT, SHARE, listing, shared

EXPECTED = (
    "systemd/gpugate.service",
    "systemd/ollama.service.d/gpugate.conf",
    "systemd/comfyui.service.d/gpugate.conf",
    "systemd/whisper-server.service.d/gpugate.conf",
    "systemd/examples/ollama.service",
    "systemd/examples/comfyui.service",
    "systemd/examples/whisper-server.service",
    "alerts.yml",
    "alerts.test.yml",
    "grafana-dashboard.json",
    "deploy/Containerfile",
    "deploy/helm/gpugate/Chart.yaml",
    "deploy/helm/gpugate/values.yaml",
    "deploy/kubernetes/kustomization.yaml",
    "deploy/nomad/gpugate.nomad.hcl",
)
"""What an operator's docs name, at least."""


def share(*argv: str) -> tuple[int, str, str]:
    from gpugate.commands import share as command

    args = cli._parser().parse_args(["share", *argv])
    out, err = io.StringIO(), io.StringIO()
    return command.run(args, out, err), out.getvalue(), err.getvalue()


def test_the_package_carries_every_file_the_docs_name():
    names = listing()
    assert set(EXPECTED) <= set(names), set(EXPECTED) - set(names)
    assert GATE_UNIT in names
    assert not any(name.endswith((".py", ".pyc")) for name in names), names


def test_share_prints_the_directory_or_a_file_in_it():
    code, out, err = share()
    assert (code, out, err) == (Exit.OK, f"{SHARE}\n", "")
    code, out, _ = share("systemd/gpugate.service")
    assert code == Exit.OK
    path = Path(out.strip())
    assert path.is_absolute() and path == SHARE / "systemd" / "gpugate.service"
    assert path.read_text().startswith("[Unit]")


def test_share_lists_the_files_under_a_directory():
    code, out, _ = share("--list", "systemd")
    assert code == Exit.OK
    listed = out.split()
    assert listed == [name for name in listing() if name.startswith("systemd/")]
    assert "systemd/gpugate.service" in listed and "alerts.yml" not in listed
    code, out, _ = share("--list")
    assert out.split() == listing()


@pytest.mark.parametrize("path", ["nowhere.conf", "../cli.py", "/etc/passwd", "systemd/../.."])
def test_a_path_outside_or_not_there_is_a_usage_error(path):
    code, out, err = share(path)
    assert code == Exit.USAGE and out == ""
    assert err.startswith(f"gpugate share: {path}: ") and "--list" in err
    with pytest.raises((ValueError, FileNotFoundError)):
        shared(path)
