"""The files gpugate carries for the operator, in gpugate/share/ (package data, so a wheel
installs them beside the code): the gate's systemd unit, the runtimes' drop-ins and the
base units they are checked against, the Prometheus alert rules and their unit tests, the
Grafana dashboard, and deploy/ (the Helm chart, its rendered Kubernetes manifests, the
Nomad job, the Containerfile). They exist once, here; docs, tests and `gpugate init` read
them from this directory, and `gpugate share PATH` prints where one is installed.
"""

from __future__ import annotations

from pathlib import Path, PurePosixPath

SHARE = Path(__file__).resolve().with_name("share")
"""The directory of the packaged files."""

GATE_UNIT = "systemd/gpugate.service"
"""The gate's unit, as `gpugate init` writes it (with this gpugate's path) and installs it."""

SHIPPED_PROGRAM = "/usr/local/bin/gpugate"
"""The gpugate program the shipped unit and drop-ins name."""


def shared(relative: str) -> Path:
    """The packaged file or directory at `relative` (a path under gpugate/share/, with `/`).

    Raises ValueError for a path that leaves the directory and FileNotFoundError for one
    that is not there."""
    parts = PurePosixPath(relative).parts
    if PurePosixPath(relative).is_absolute() or ".." in parts:
        raise ValueError(f"{relative}: a path inside gpugate's share directory")
    path = SHARE.joinpath(*parts)
    if not path.exists():
        raise FileNotFoundError(f"{relative}: not among gpugate's packaged files")
    return path


def listing() -> list[str]:
    """Every packaged file, as a path under the directory, sorted."""
    return sorted(
        str(path.relative_to(SHARE).as_posix())
        for path in SHARE.rglob("*")
        if path.is_file() and "__pycache__" not in path.parts
    )
