"""What the llama-server a simulated Ollama starts for a model holds, from the model's blob.

Ollama v0.30 and later (ollama/ollama fb30760) starts each model in a llama-server child
with `-c num_ctx × parallel -np parallel` and, where the request set no `num_batch`, a batch
by the context (llm/llama_server.go `startLlamaServer`, `appendBatchArgs`; server/sched.go
`generationBatchForContext`: 512 up to 4096 tokens, 1024 up to 32768, 2048 above; an
embedding model min(2048, its context), `DefaultEmbeddingNumBatchForContext`), flash
attention on `auto` and no `-ngl`. What that child then holds is the simulated
llama-server's own rule (gpugate_sim.llamaserver.memory), read from the blob's header as
llama-server reads it, and its CUDA context.

Which context a request that sets none gets is Ollama's too (server/routes.go `Serve`):
OLLAMA_CONTEXT_LENGTH, else by the VRAM of the GPUs it sees, 262144 from 47 GiB, 32768
from 23 GiB, else 4096.
"""

from __future__ import annotations

import functools

from gpugate.core.units import GiB
from gpugate_sim.llamaserver.memory import CUDA_CONTEXT, plan
from gpugate_sim.llamaserver.model import ModelInfo, load_model_info

CONTEXT_TIERS = ((47 * GiB, 262144), (23 * GiB, 32768))
DEFAULT_CONTEXT = 4096
EMBEDDING_BATCH = 2048
AUTO_BATCH = 512
"""The num_batch a request that sets none reads as (api.DefaultOptions)."""


def vram_context(vram: int, context_length: int = 0) -> int:
    """The context of a request that sets none, on GPUs of `vram` bytes in all."""
    if context_length > 0:
        return context_length
    return next((ctx for least, ctx in CONTEXT_TIERS if vram >= least), DEFAULT_CONTEXT)


def batch_for(context: int, num_batch: int, embedding: bool) -> int:
    """The `-b`/`-ub` Ollama starts the child with."""
    if num_batch != AUTO_BATCH:
        return num_batch
    if embedding:
        return min(EMBEDDING_BATCH, context)
    if context > 32768:
        return 2048
    return 1024 if context > 4096 else 512


@functools.lru_cache(maxsize=64)
def _info(path: str) -> ModelInfo:
    return load_model_info(path)


def runner_bytes(blob: str, num_ctx: int, parallel: int, num_batch: int, embedding: bool) -> int:
    """The child's bytes on the GPU with every layer there: its buffers for `num_ctx` a
    slot and its CUDA context."""
    info = _info(blob)
    context = num_ctx * parallel
    batch = min(batch_for(context, num_batch, embedding), context)
    buffers = plan(info, context, info.n_layer + 1, batch, streams=parallel, slots=parallel)
    return buffers.total + CUDA_CONTEXT
