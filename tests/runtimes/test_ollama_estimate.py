"""A never-measured model is sized as Ollama v0.24.0 sizes its load."""

from __future__ import annotations

from gpugate.core.units import GiB, MiB
from gpugate.runtimes.ollama.models import RUNTIME_OVERHEAD, estimate_bytes

# llama3.2:3b (Q4_K_M) as its GGUF describes it, and its file.
LLAMA32_3B = {
    "general.architecture": "llama",
    "llama.block_count": 28,
    "llama.embedding_length": 3072,
    "llama.attention.head_count": 24,
    "llama.attention.head_count_kv": 8,
    "llama.attention.key_length": 128,
    "llama.attention.value_length": 128,
    "llama.context_length": 131072,
    "llama.vocab_size": 128256,
    "tokenizer.ggml.tokens": [],  # /api/show leaves long arrays out unless verbose
}
WEIGHTS = 2_019_377_376


def test_llama32_3b_is_sized_with_its_kv_cache_and_graph_not_as_its_file():
    estimate = estimate_bytes(WEIGHTS, LLAMA32_3B, "")
    kv = 4096 * (128 + 128) * 8 * 2 * 28  # the default 4k context, f16, 28 layers
    graph = 4 * 512 * (3072 + 128256)  # the output's graph outweighs the context's
    assert estimate == WEIGHTS + kv + graph + RUNTIME_OVERHEAD
    # What the card showed for it: 3.1 GiB, not the 2.13 GiB its file suggested.
    assert abs(estimate - 3.1 * GiB) < 128 * MiB


def test_a_larger_context_grows_the_kv_cache_and_graph_up_to_the_trained_context():
    small = estimate_bytes(WEIGHTS, LLAMA32_3B, "")
    large = estimate_bytes(WEIGHTS, LLAMA32_3B, "num_ctx=32768")
    kv_growth = (32768 - 4096) * (128 + 128) * 8 * 2 * 28
    assert large - small > kv_growth
    capped = {**LLAMA32_3B, "llama.context_length": 8192}
    assert estimate_bytes(WEIGHTS, capped, "num_ctx=32768") == estimate_bytes(
        WEIGHTS, capped, "num_ctx=8192"
    )


def test_an_unknown_architecture_uses_ollamas_graph_fallback():
    info = {k.replace("llama.", "granite."): v for k, v in LLAMA32_3B.items()}
    info["general.architecture"] = "granite"
    kv = 4096 * (128 + 128) * 8 * 2 * 28
    assert estimate_bytes(WEIGHTS, info, "") == WEIGHTS + kv + 24 // 8 * kv // 6 + RUNTIME_OVERHEAD


def test_without_the_models_shape_only_the_weights_are_known():
    assert estimate_bytes(WEIGHTS, {"general.architecture": "llama"}, "") == (
        WEIGHTS + RUNTIME_OVERHEAD
    )
    assert estimate_bytes(WEIGHTS, None, "") == WEIGHTS + RUNTIME_OVERHEAD
