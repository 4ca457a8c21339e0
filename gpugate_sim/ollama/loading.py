"""A load about to start: the runner the scheduler will track, and the command that starts it.

Ollama's `load` (server/sched.go) places the model, then starts a llama-server runner on the
chosen GPUs; the runner lays the model over them (gpugate_sim.ollama.layout).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from gpugate_sim.ollama.catalog import CatalogModel
from gpugate_sim.ollama.layout import lay_out
from gpugate_sim.ollama.options import RequestOptions, effective_num_ctx
from gpugate_sim.ollama.placement import LoadPlan
from gpugate_sim.ollama.process import RunnerCommand
from gpugate_sim.ollama.runnerref import Runner
from gpugate_sim.ollama.spec import OllamaSpec

SIMULATED_LOAD_FAILURE = "error loading model: simulated load failure"


def prepare(
    spec: OllamaSpec,
    state_dir: Path,
    model: CatalogModel,
    options: RequestOptions,
    keep_alive: int,
    *,
    size: int,
    explicit: int | None,
    plan: LoadPlan,
) -> tuple[Runner, RunnerCommand]:
    """The runner of a load placed by `plan` and its command line.

    `size` is the runner's bytes, `explicit` the bytes an explicit `num_gpu` asks on the
    GPUs (None: automatic), `keep_alive` the duration the runner starts with.
    """
    runner_options = options.runner
    layout = lay_out(
        plan.runner_gpus, plan.runner_free, size=size, block_count=model.spec.block_count,
        explicit=explicit, fit_margin=spec.fit_margin,
    )  # fmt: skip
    parallel = 1 if model.spec.embedding else spec.num_parallel
    runner = Runner(
        model=model,
        options=runner_options,
        size=size,
        size_vram=layout.vram,
        shares=layout.shares,
        context_length=effective_num_ctx(model, runner_options),
        slots=asyncio.Semaphore(parallel),
        keep_alive=keep_alive,
        num_ctx_auto=options.num_ctx_auto,
    )
    command = RunnerCommand(
        state_dir=state_dir,
        shares=layout.shares,
        load_seconds=model.spec.load_seconds,
        blob_path=model.blob_path,
        num_ctx=runner.context_length,
        num_parallel=parallel,
        num_batch=runner_options.num_batch,
        gpu_layers=layout.gpu_layers,
        main_gpu=plan.placement.main_gpu,
        fail=SIMULATED_LOAD_FAILURE if options.load_fail else plan.error,
    )
    return runner, command
