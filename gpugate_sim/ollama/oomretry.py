"""What the simulated Ollama does when a load runs out of memory (server/sched.go `load`).

Once a request (`LlmRequest.oomRetryAttempted`), a load whose runner fails with an error
llm/status.go `IsOutOfMemory` names is tried again: with the next lower automatic context
when the context was Ollama's to pick (`reduceAutoNumCtxForLoadOOM`), else as it was when
other models are loaded; the scheduler evicts every other model first
(`evictAllAndWait`). With neither it fails at once.
"""

from __future__ import annotations

import attrs

from gpugate_sim.ollama.catalog import CatalogModel
from gpugate_sim.ollama.options import RequestOptions

OUT_OF_MEMORY = (
    "out of memory", "out of device memory", "cudamalloc failed", "hipmalloc failed",
    "failed to allocate", "allocation failed", "not enough memory", "insufficient memory",
    "vk_error_out_of_device_memory", "erroroutofmemory",
)  # fmt: skip
"""llm/status.go `outOfMemorySubstrings`, lower-cased."""


def is_out_of_memory(message: str) -> bool:
    """llm/status.go `IsOutOfMemoryMessage`: the error names an out-of-memory condition."""
    lowered = message.lower()
    return any(needle in lowered for needle in OUT_OF_MEMORY)


def next_lower_auto_num_ctx(num_ctx: int) -> int | None:
    """server/sched.go `nextLowerAutoNumCtx`: the automatic context a load OOM retries with
    (32768 above it, 4096 above that), None at 4096 or below."""
    if num_ctx > 32768:
        return 32768
    if num_ctx > 4096:
        return 4096
    return None


def reduced_for_load_oom(model: CatalogModel, options: RequestOptions) -> RequestOptions | None:
    """server/sched.go `reduceAutoNumCtxForLoadOOM`: the options with the next lower
    automatic context (after capping at the training context), or None when the context was
    not automatic or is already the least. The batch follows the context (sizing.batch_for),
    as `applyAutomaticGenerationBatch` makes it."""
    if not options.num_ctx_auto:
        return None
    old = options.runner.num_ctx
    lower = next_lower_auto_num_ctx(min(old, model.spec.context_length))
    if lower is None or lower >= old:
        return None
    return attrs.evolve(options, runner=attrs.evolve(options.runner, num_ctx=lower))


def retry_options(
    model: CatalogModel, options: RequestOptions, reason: str, others_loaded: bool
) -> RequestOptions | None:
    """The options a load that failed with `reason` is tried again with, or None when
    sched.go `load` fails the request instead (its one retry not yet spent)."""
    if not is_out_of_memory(reason):
        return None
    reduced = reduced_for_load_oom(model, options)
    if reduced is not None:
        return reduced
    return options if others_loaded else None
