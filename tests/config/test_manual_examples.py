"""Every complete consumer example in the configuration manual loads as written."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from gpugate.runtimes.sections import load_config_text

MANUAL = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"
TEXT = MANUAL.read_text()
CHECK_EXAMPLE = re.search(r"For this file:\n\n```yaml\n(.*?)```", TEXT, re.S)
BLOCKS = [
    block
    for block in re.findall(r"```yaml\n(.*?)```", TEXT, re.S)
    # A consumer with its upstream is a whole example; the check example's errors are meant.
    if "upstream:" in block and (CHECK_EXAMPLE is None or block != CHECK_EXAMPLE.group(1))
]


def test_the_manual_has_examples_for_each_runtime_it_documents():
    runtimes = {m for block in BLOCKS for m in re.findall(r"runtime: ([a-z-]+)", block)}
    assert {"ollama", "comfyui", "llama-server", "vllm"} <= runtimes


@pytest.mark.parametrize("block", BLOCKS, ids=lambda b: re.search(r"runtime: ([a-z-]+)", b)[1])
def test_a_manual_example_loads(block: str) -> None:
    config = load_config_text(block, Path("consumers.yaml"))
    assert config.consumers
