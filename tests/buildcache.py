"""The servers tests build from PyPI sdists (tests/*/build.sh), cached per version.

A build script leaves its binary in build/ and its log under the cache directory
($GPUGATE_CACHE, else $XDG_CACHE_HOME/gpugate, else ~/.cache/gpugate), in
`NAME/VERSION/build.log`. A binary fixture finds the binary, or fails with that log's
tail when this machine could have built it.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest


def build_log(name: str, version: str) -> Path:
    """Where the build of `name` at `version` writes its log."""
    cache = os.environ.get("GPUGATE_CACHE") or str(
        Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "gpugate"
    )
    return Path(cache) / name / version / "build.log"


def tail(path: Path, lines: int = 40) -> str:
    """The last `lines` lines of `path`, or why it could not be read."""
    try:
        text = path.read_text(errors="replace")
    except OSError as exc:
        return f"({path}: {exc.strerror})"
    return "\n".join(text.splitlines()[-lines:])


def locate_binary(binary: Path, name: str, version: str) -> Path:
    """`binary` (build/NAME); a failure, not a skip, when this machine could have built it."""
    if binary.is_file() and os.access(binary, os.X_OK):
        return binary
    compiler = shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")
    if shutil.which("cmake") is None or compiler is None:
        pytest.skip(f"build/{name} is missing and there is no cmake or C++ compiler")
    log = build_log(name, version)
    pytest.fail(
        f"{binary} is missing although cmake and {compiler} are here: "
        f"run `make build/{name}`. Tail of {log}:\n{tail(log)}",
        pytrace=False,
    )
