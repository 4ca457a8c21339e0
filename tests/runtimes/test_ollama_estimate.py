"""A never-measured model is sized as the llama-server Ollama starts for it will hold it:
from its GGUF header where the gate can read the blob /api/show names, else from what
/api/show says of the model (its metadata and tensor table)."""

from __future__ import annotations

from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from gpugate.config.model import Upstream
from gpugate.core.units import GiB, MiB
from gpugate.runtimes.footprint import Cards
from gpugate.runtimes.gguf import read_file
from gpugate.runtimes.llamacpp import CUDA_CONTEXT, LoadOptions, header_shape, load_size
from gpugate.runtimes.ollama.memory import (
    OllamaMemory,
    blob_path,
    default_context,
    modelfile_parameters,
    show_shape,
)
from gpugate.runtimes.ollama.settings import OllamaSettings
from gpugate.runtimes.registry import runtime_for
from gpugate.runtimes.sections import load_config_text
from tests.llamaserver.gguf_models import write_tiny_llama

# llama3.2:3b (Q4_K_M) as /api/show describes it: its keys (long arrays emptied) and its
# tensor table, the token embeddings tied to the output (no output.weight).
N_LAYER, N_EMBD, N_FF, N_VOCAB = 28, 3072, 8192, 128256
LLAMA32_INFO = {
    "general.architecture": "llama",
    "llama.block_count": N_LAYER,
    "llama.embedding_length": N_EMBD,
    "llama.feed_forward_length": N_FF,
    "llama.attention.head_count": 24,
    "llama.attention.head_count_kv": 8,
    "llama.attention.key_length": 128,
    "llama.attention.value_length": 128,
    "llama.context_length": 131072,
    "llama.vocab_size": N_VOCAB,
    "tokenizer.ggml.tokens": [],
}


def llama32_tensors() -> list[dict[str, object]]:
    tensors: list[dict[str, object]] = [
        {"name": "token_embd.weight", "type": "Q6_K", "shape": [N_EMBD, N_VOCAB]},
        {"name": "output_norm.weight", "type": "F32", "shape": [N_EMBD]},
    ]
    for i in range(N_LAYER):
        for name, kind, shape in (
            ("attn_norm", "F32", [N_EMBD]),
            ("attn_q", "Q4_K", [N_EMBD, N_EMBD]),
            ("attn_k", "Q4_K", [N_EMBD, 1024]),
            ("attn_v", "Q6_K", [N_EMBD, 1024]),
            ("attn_output", "Q4_K", [N_EMBD, N_EMBD]),
            ("ffn_norm", "F32", [N_EMBD]),
            ("ffn_gate", "Q4_K", [N_EMBD, N_FF]),
            ("ffn_up", "Q4_K", [N_EMBD, N_FF]),
            ("ffn_down", "Q6_K", [N_FF, N_EMBD]),
        ):
            tensors.append({"name": f"blk.{i}.{name}.weight", "type": kind, "shape": shape})
    return tensors


def show_answer(modelfile: str = "FROM /nowhere/blobs/sha256-00\n", **extra: object) -> dict:
    return {
        "modelfile": modelfile,
        "parameters": "",
        "model_info": LLAMA32_INFO,
        "tensors": llama32_tensors(),
        **extra,
    }


def memory(settings: str = "") -> OllamaMemory:
    config = load_config_text(
        "consumers:\n  ollama:\n    runtime: ollama\n    listen: 127.0.0.1:11434\n"
        f"    upstream: http://127.0.0.1:11435\n{settings}",
        "consumers.yaml",
    )
    runtime = runtime_for(config.consumers[0])
    assert runtime is not None and isinstance(runtime.memory, OllamaMemory)
    return runtime.memory


CARD_16 = Cards((16 * GiB,))


def test_llama32_3b_is_sized_as_its_llama_server_holds_it():
    shape = show_shape(show_answer())
    assert shape is not None
    # The token embeddings stay on the CPU; tied to the output, they go to the GPU again.
    assert shape.tied and shape.output_layer > shape.input_bytes > 300 * MiB
    load = memory().load(shape, {}, "", CARD_16)
    assert load.n_ctx == 4096  # a 16 GiB card: Ollama's 4k tier
    assert load.weights == shape.weights
    assert load.kv == 4096 * N_LAYER * 8 * (128 + 128) * 2  # 448 MiB, f16
    # 512 tokens a micro-batch: the feed-forward phase (3 n_ff + 4 n_embd floats a token)
    # and the attention mask over the context in f16.
    assert load.compute == 4 * 512 * (3 * N_FF + 4 * N_EMBD) + 2 * 4096 * 512
    assert load.context == CUDA_CONTEXT
    # What the card showed for it under Ollama: about 3 GiB, not the 1.9 GiB of its file.
    assert 2.7 * GiB < load.total < 3.2 * GiB


def test_the_context_is_the_requests_the_modelfiles_or_the_vram_tiers():
    shape = show_shape(show_answer())
    assert shape is not None
    sizer = memory()
    assert sizer.load(shape, {}, "num_ctx=8192", CARD_16).n_ctx == 8192
    assert sizer.load(shape, {"num_ctx": 2048}, "", CARD_16).n_ctx == 2048
    assert sizer.load(shape, {"num_ctx": 2048}, "num_ctx=1024", CARD_16).n_ctx == 1024
    assert sizer.load(shape, {}, "", Cards((24 * GiB,))).n_ctx == 32768
    assert sizer.load(shape, {}, "", Cards((24 * GiB, 24 * GiB))).n_ctx == 131072  # capped
    assert sizer.load(shape, {}, "num_ctx=1", CARD_16).n_ctx == 4
    # The batch follows the context (sched.go generationBatchForContext).
    small = sizer.load(shape, {}, "", CARD_16)
    large = sizer.load(shape, {}, "num_ctx=32768", CARD_16)
    assert large.kv == 8 * small.kv
    assert large.compute == 4 * 1024 * (3 * N_FF + 4 * N_EMBD) + 2 * 32768 * 1024


def test_ollamas_own_settings_change_the_context_and_the_slots():
    settings = OllamaSettings()
    assert default_context(Cards(), settings) == 4096
    assert default_context(Cards((48 * GiB,)), settings) == 262144
    overhead = OllamaSettings(gpu_overhead=2 * GiB)
    assert default_context(Cards((24 * GiB,)), overhead) == 4096
    assert default_context(Cards((80 * GiB,)), OllamaSettings(context_length=8192)) == 8192
    shape = show_shape(show_answer())
    assert shape is not None
    two = memory("    ollama: {num_parallel: 2, kv_cache_type: q8_0}\n")
    load = two.load(shape, {}, "", CARD_16)
    assert load.n_ctx == 8192 and load.kv == 8192 * N_LAYER * 8 * 256 * 1


def test_an_embedding_model_runs_one_slot_with_a_batch_of_its_context():
    info = {**LLAMA32_INFO, "llama.pooling_type": 1}
    shape = show_shape(show_answer(model_info=info))
    assert shape is not None and shape.embedding
    sizer = memory("    ollama: {num_parallel: 4}\n")
    launch = sizer.launch(shape, {}, "num_ctx=8192", CARD_16)
    assert (launch.n_ctx, launch.n_parallel, launch.n_ubatch) == (8192, 1, 2048)


def test_what_show_says_matches_the_blob_it_names(tmp_path: Path):
    path = write_tiny_llama(tmp_path / "blobs" / "sha256-abc", n_ff=256)
    header = read_file(path)
    from_file = header_shape(header)
    tensors = [
        {"name": t.name, "type": "F16" if t.ggml_type == 1 else "F32", "shape": list(t.dims)}
        for t in header.tensors
    ]
    info = {k: v for k, v in header.metadata.items() if isinstance(v, int | str)}
    from_show = show_shape({"model_info": info, "tensors": tensors})
    assert from_file is not None and from_show is not None
    assert from_show.weights == from_file.weights
    assert (from_show.layer_bytes, from_show.n_ff) == (from_file.layer_bytes, from_file.n_ff)
    options = LoadOptions(n_ctx=512)
    assert load_size(from_show, options) == load_size(from_file, options)


def test_the_modelfile_names_the_blob_and_the_parameters():
    text = "# Modelfile generated\n# FROM llama3.2:3b\n\nFROM /var/lib/ollama/blobs/sha256-9f\n"
    assert blob_path(text) == "/var/lib/ollama/blobs/sha256-9f"
    assert blob_path("FROM llama3.2:3b\n") is None
    assert blob_path(None) is None
    params = modelfile_parameters('num_ctx                        8192\nstop    "<|eot|>"')
    assert params == {"num_ctx": 8192}


async def estimate_through(aiohttp_server, answer: web.Response, sizer: OllamaMemory):
    async def show(request: web.Request) -> web.Response:
        return answer

    app = web.Application()
    app.router.add_post("/api/show", show)
    server = await aiohttp_server(app)
    sizer.show_url = str(server.make_url("/api/show"))
    async with aiohttp.ClientSession() as session:
        return await sizer.estimate(session, "llama3.2:3b", "", CARD_16)


async def test_the_estimate_reads_the_blob_when_it_can(aiohttp_server, tmp_path: Path):
    path = write_tiny_llama(tmp_path / "sha256-tiny", n_ff=256, context_length=4096)
    answer = web.json_response(show_answer(f"FROM {path}\n"))
    sizer = memory()
    found = await estimate_through(aiohttp_server, answer, sizer)
    shape = header_shape(read_file(path))
    assert shape is not None and found is not None
    assert found.ceiling == found.floor == sizer.load(shape, {}, "", CARD_16).total
    # Capped: the largest context whose load fits what the gate may give.
    cap = sizer.cap("llama3.2:3b", found.ceiling, CARD_16)
    assert cap is not None and cap.options == (("num_ctx", 4096),)


async def test_the_estimate_falls_back_to_what_show_says(aiohttp_server):
    found = await estimate_through(aiohttp_server, web.json_response(show_answer()), memory())
    shape = show_shape(show_answer())
    assert shape is not None and found is not None
    assert found.ceiling == memory().load(shape, {}, "", CARD_16).total


async def test_a_model_ollama_lacks_is_not_sized(aiohttp_server):
    missing = web.json_response({"error": "model 'x' not found"}, status=404)
    assert await estimate_through(aiohttp_server, missing, memory()) is None


@pytest.mark.parametrize("body", [{"model_info": {}}, {"tensors": []}, {}])
async def test_without_a_shape_the_listed_size_is_taken_whole(aiohttp_server, body):
    async def show(request: web.Request) -> web.Response:
        return web.json_response(body)

    async def tags(request: web.Request) -> web.Response:
        listed = [{"name": "other:latest", "size": 5}, {"name": "llama3.2:3b", "size": GiB}]
        return web.json_response({"models": listed})

    app = web.Application()
    app.router.add_post("/api/show", show)
    app.router.add_get("/api/tags", tags)
    server = await aiohttp_server(app)
    sizer = memory()
    sizer.show_url = str(server.make_url("/api/show"))
    sizer.tags_url = str(server.make_url("/api/tags"))
    async with aiohttp.ClientSession() as session:
        found = await sizer.estimate(session, "llama3.2:3b", "", CARD_16)
        assert found is not None and found.ceiling == GiB + CUDA_CONTEXT
        assert await sizer.estimate(session, "absent:latest", "", CARD_16) is None


def test_upstream_is_what_the_memory_asks():
    sizer = memory()
    assert sizer.show_url == Upstream.parse("http://127.0.0.1:11435").url + "/api/show"
    assert sizer.tags_url == Upstream.parse("http://127.0.0.1:11435").url + "/api/tags"


@pytest.mark.parametrize(
    ("setting", "where"),
    [
        ("{kv_cache_type: q5_1}", "consumers.ollama.ollama.kv_cache_type"),
        ("{num_parallel: 0}", "consumers.ollama.ollama.num_parallel"),
        ("{context_length: -1}", "consumers.ollama.ollama.context_length"),
    ],
)
def test_ollamas_settings_are_checked(setting, where):
    from gpugate.config.loader import ConfigError

    with pytest.raises(ConfigError) as failed:
        memory(f"    ollama: {setting}\n")
    assert where in str(failed.value)
