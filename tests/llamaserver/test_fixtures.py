"""The binary fixture: a missing build fails where it could have been built, else skips."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.llamaserver.conftest import BINARY, locate_binary


def test_built_binary_is_found() -> None:
    if not BINARY.exists():
        pytest.skip("build/llama-server not built here")
    assert locate_binary(BINARY) == BINARY


def test_missing_binary_fails_with_the_build_log(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = tmp_path / "gpugate" / "llama-server" / "0.3.36" / "build.log"
    log.parent.mkdir(parents=True)
    log.write_text("[ 61%] Building CXX object\nerror: the compiler ran out of memory\n")
    monkeypatch.setenv("GPUGATE_CACHE", str(tmp_path / "gpugate"))
    monkeypatch.setattr(shutil, "which", lambda name: f"/usr/bin/{name}")
    with pytest.raises(pytest.fail.Exception, match="ran out of memory"):
        locate_binary(tmp_path / "llama-server")


def test_missing_binary_without_a_toolchain_skips(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(shutil, "which", lambda name: None if name == "cmake" else name)
    with pytest.raises(pytest.skip.Exception, match="no cmake"):
        locate_binary(tmp_path / "llama-server")
