"""Model names as Ollama's ParseName reads them."""

from __future__ import annotations

import pytest

from gpugate.runtimes.ollama.names import canonical_name, parse_name


@pytest.mark.parametrize(
    ("text", "canonical"),
    [
        ("gemma3:12b", "gemma3:12b"),
        ("bge-m3", "bge-m3:latest"),
        ("Library/BGE-M3", "bge-m3:latest"),
        ("REGISTRY.OLLAMA.AI/library/m:Q4", "m:q4"),
        ("team/m", "team/m:latest"),
        ("hf.co/org/model:Q4_K_M", "hf.co/org/model:q4_k_m"),
        ("registry.local:5000/team/model", "registry.local:5000/team/model:latest"),
        ("https://hf.co/org/model", "hf.co/org/model:latest"),
        ("team/skill/m", "team/skill/m:latest"),
    ],
)
def test_valid_names(text, canonical):
    assert canonical_name(text) == canonical


@pytest.mark.parametrize(
    "text",
    [
        "",
        " m",
        "m ",
        "m:",
        ":tag",
        "/m",
        "a//m",
        "a/b/c/d/e",
        "te.am/m",
        "m@sha256:00",
        "é",
        "-m",
        "m" * 81,
        "m:" + "t" * 81,
    ],
)
def test_invalid_names(text):
    assert parse_name(text) is None and canonical_name(text) is None
