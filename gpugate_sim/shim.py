"""Find (and if needed build) the fake `libnvidia-ml.so.1` of the simulated host."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

SOURCE = Path(__file__).with_name("fakenvml.c")
SONAME = "libnvidia-ml.so.1"
STATE_ENV = "GPUGATE_FAKE_NVML_STATE"
"""The fake library reads the device state from the file this variable names."""


def _default_build_dir() -> Path:
    # In a source checkout `make` builds into <repo>/build/fakenvml; an installed package
    # builds into the user's cache instead.
    repo = Path(__file__).resolve().parents[1]
    if (repo / "Makefile").exists() and (repo / "pyproject.toml").exists():
        return repo / "build" / "fakenvml"
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    return cache / "gpugate" / "fakenvml"


def library_path(build_dir: Path | None = None) -> Path:
    """Path of the fake library, compiled with gcc when missing or older than its source."""
    explicit = os.environ.get("GPUGATE_FAKENVML")
    if explicit:
        return Path(explicit)
    out = (build_dir or _default_build_dir()) / SONAME
    if out.exists() and out.stat().st_mtime >= SOURCE.stat().st_mtime:
        return out
    return build(out)


def build(out: Path) -> Path:
    """Compile the fake library to `out` (gcc is the one system tool the project assumes)."""
    gcc = shutil.which("gcc") or shutil.which("cc")
    if gcc is None:
        raise RuntimeError("building the fake NVML library needs gcc (or cc) on PATH")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(f".tmp{os.getpid()}")
    subprocess.run(
        [
            gcc,
            "-shared",
            "-fPIC",
            "-O2",
            "-Wall",
            "-Wextra",
            "-Werror",
            f"-Wl,-soname,{SONAME}",
            "-o",
            str(tmp),
            str(SOURCE),
            "-lpthread",
        ],
        check=True,
    )
    os.replace(tmp, out)
    return out
