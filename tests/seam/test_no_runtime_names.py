"""The parts between the listener and the core know runtimes only through the adapter."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import gpugate

ROOT = Path(gpugate.__file__).parent
GENERIC = ["gate", "proxy", "control", "serve.py", "reload.py"]
RUNTIME_NAMES = re.compile(r"ollama", re.IGNORECASE)


def sources() -> list[Path]:
    found: list[Path] = []
    for name in GENERIC:
        path = ROOT / name
        found.extend(sorted(path.rglob("*.py")) if path.is_dir() else [path])
    return found


@pytest.mark.parametrize("path", sources(), ids=lambda p: str(p.relative_to(ROOT)))
def test_names_no_runtime(path: Path) -> None:
    hits = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if RUNTIME_NAMES.search(line)
    ]
    assert hits == []


def test_the_guard_sees_the_files() -> None:
    names = {p.relative_to(ROOT).as_posix() for p in sources()}
    assert {"gate/gate.py", "gate/unloads.py", "proxy/listener.py", "serve.py"} <= names
