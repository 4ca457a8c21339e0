"""What llama-server holds for a model, against what the real one allocated.

Each row was read from the buffer sizes llama-server (llama-cpp-python 0.3.36's llama.cpp,
the CPU build tests/llamaserver/build.sh makes) logs at load, `-t 1`, for the tiny llama
models tests/llamaserver/gguf_models.py writes: `CPU_Mapped model buffer`, `CPU KV
buffer`, `CPU compute buffer`, in MiB to two places. The shapes vary the width, the
feed-forward, the heads, the context, the micro-batch, the slots and flash attention, so
each part of the compute buffer's rule (gpugate.runtimes.llamacpp) is pinned by a point.
tests/llamaserver/test_estimates.py loads the same kind of model in the real server.
"""

from __future__ import annotations

import shlex
from pathlib import Path

import attrs
import pytest

from gpugate.core.units import GiB, MiB
from gpugate.runtimes.gguf import read_file
from gpugate.runtimes.llamacpp import (
    CUDA_CONTEXT,
    FIT_MIN_CTX,
    LoadOptions,
    ModelShape,
    fit_context,
    fitted,
    header_shape,
    load_size,
)
from tests.llamaserver.gguf_models import write_tiny_llama

# (n_layer, n_embd, n_head, n_head_kv, n_ff, context_length), arguments beyond `-m FILE`,
# (model, KV, compute) MiB as the real llama-server logged them.
MEASURED = [
    ((2, 64, 4, 2, 128, 4096), "-c 512", (0.21, 0.12, 1.51)),
    ((2, 64, 4, 2, 128, 4096), "-c 2048", (0.21, 0.5, 3.01)),
    ((2, 64, 4, 2, 512, 4096), "-c 512", (0.49, 0.12, 4.01)),
    ((2, 64, 4, 2, 512, 4096), "-c 2048", (0.49, 0.5, 5.51)),
    ((2, 256, 4, 2, 128, 4096), "-c 512", (1.38, 0.5, 3.26)),
    ((2, 256, 4, 2, 128, 4096), "-c 2048", (1.38, 2.0, 4.76)),
    ((2, 256, 4, 2, 1024, 4096), "-c 512", (4.01, 0.5, 8.51)),
    ((2, 256, 4, 2, 1024, 4096), "-c 2048", (4.01, 2.0, 10.01)),
    ((2, 256, 16, 4, 1024, 4096), "-c 2048", (3.88, 1.0, 10.01)),
    ((2, 256, 4, 2, 1024, 4096), "-c 2048 -ub 128", (4.01, 2.0, 2.5)),
    ((2, 256, 4, 2, 1024, 4096), "-c 2048 -fa off", (4.01, 2.0, 23.01)),
    ((2, 64, 4, 2, 128, 4096), "-c 2048 -fa off", (0.21, 0.5, 20.76)),
    ((2, 256, 16, 4, 1024, 4096), "-c 2048 -fa off", (3.88, 1.0, 70.76)),
    ((2, 64, 4, 2, 32, 4096), "-c 512", (0.13, 0.12, 1.2)),
    ((2, 128, 4, 2, 32, 4096), "-c 512", (0.36, 0.25, 1.76)),
    ((2, 256, 4, 2, 32, 4096), "-c 512", (1.1, 0.5, 3.01)),
    ((2, 512, 4, 2, 32, 4096), "-c 512", (3.7, 1.0, 5.51)),
    ((2, 512, 8, 8, 32, 4096), "-c 512", (4.7, 2.0, 6.51)),
    ((2, 512, 8, 1, 32, 4096), "-c 512", (2.95, 0.25, 5.51)),
    ((2, 512, 4, 2, 32, 4096), "-c 512 -ub 256", (3.7, 1.0, 2.76)),
    ((4, 512, 4, 2, 32, 4096), "-c 512", (6.9, 2.0, 5.51)),
    ((2, 64, 4, 2, 32, 4096), "-c 512 -ub 64", (0.13, 0.12, 0.15)),
    ((2, 512, 4, 2, 4096, 4096), "-c 512", (27.52, 1.0, 28.51)),
    ((2, 512, 4, 2, 2048, 4096), "-c 4096", (15.52, 8.0, 20.01)),
    ((2, 64, 4, 2, 64, 4096), "-c 512", (0.16, 0.12, 1.14)),
    ((2, 64, 4, 2, 96, 4096), "-c 512", (0.18, 0.12, 1.39)),
    ((2, 64, 4, 2, 192, 4096), "-c 512", (0.25, 0.12, 2.14)),
    ((2, 64, 4, 2, 256, 4096), "-c 512", (0.3, 0.12, 2.51)),
    ((2, 64, 4, 2, 384, 4096), "-c 512", (0.39, 0.12, 3.26)),
    ((2, 128, 4, 2, 128, 4096), "-c 512", (0.5, 0.25, 1.76)),
    ((2, 128, 4, 2, 256, 4096), "-c 512", (0.69, 0.25, 2.51)),
    ((2, 128, 4, 2, 512, 4096), "-c 512", (1.07, 0.25, 4.51)),
    ((2, 64, 4, 2, 128, 512), "-c 512 -np 4", (0.21, 0.25, 1.26)),
    ((2, 64, 4, 2, 128, 512), "", (0.21, 0.12, 1.51)),
    ((2, 64, 4, 2, 128, 4096), "", (0.21, 1.0, 5.01)),
    ((2, 64, 4, 2, 128, 4096), "-c 1000", (0.21, 0.25, 2.01)),
    ((2, 64, 4, 2, 128, 4096), "-c 2048 -ub 2048 -b 2048", (0.21, 0.5, 12.05)),
    ((2, 512, 4, 2, 2048, 4096), "-c 4096 -np 4", (15.52, 8.0, 17.01)),
    ((2, 512, 4, 2, 2048, 4096), "-c 4096 -ub 1024 -b 1024", (15.52, 8.0, 40.02)),
]
TOLERANCE = 0.10


def on_the_cpu(args: str) -> LoadOptions:
    """What llama-server's CPU build makes of these arguments: `-np` unset means 4 slots
    sharing one KV stream, `-ub` is at most `-b`."""
    words = shlex.split(args)
    given = dict(zip(words[::2], words[1::2], strict=True))
    slots = given.get("-np")
    return LoadOptions(
        n_ctx=int(given.get("-c", 0)),
        n_parallel=int(slots) if slots else 4,
        unified=slots is None,
        n_ubatch=min(int(given.get("-ub", 512)), int(given.get("-b", 2048))),
        flash_attn=given.get("-fa", "auto") != "off",
        on_gpu=False,
    )


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[int, ...], Path]:
    base = tmp_path_factory.mktemp("shapes")
    written = {}
    for shape, _, _ in MEASURED:
        if shape not in written:
            n_layer, n_embd, n_head, n_head_kv, n_ff, ctx = shape
            written[shape] = write_tiny_llama(
                base / f"m{len(written)}.gguf", n_layer=n_layer, n_embd=n_embd, n_head=n_head,
                n_head_kv=n_head_kv, n_ff=n_ff, context_length=ctx,
            )  # fmt: skip
    return written


@pytest.mark.parametrize(("shape", "args", "logged"), MEASURED)
def test_each_buffer_is_what_the_real_server_allocated(models, shape, args, logged):
    model = header_shape(read_file(models[shape]))
    assert model is not None
    size = load_size(model, on_the_cpu(args))
    weights, kv, compute = (round(part * MiB) for part in logged)
    # The buffers are logged to a hundredth of a MiB.
    assert abs(size.weights - weights) <= 0.006 * MiB
    assert abs(size.kv - kv) <= 0.006 * MiB
    assert size.context == 0
    total = weights + kv + compute
    assert abs(size.total - total) <= TOLERANCE * total, (size, logged)


def shape(**changes: object) -> ModelShape:
    base = ModelShape(
        arch="llama", n_layer=4, n_embd=1024, n_ff=4096, n_head=16, n_head_kv=(4,) * 4,
        head_k=64, head_v=64, n_ctx_train=32768, n_vocab=32000, n_swa=0, swa_pattern=0,
        layer_bytes=(100 * MiB,) * 4, input_bytes=50 * MiB, output_bytes=60 * MiB,
    )  # fmt: skip
    return attrs.evolve(base, **changes)


def test_on_a_gpu_the_token_embeddings_stay_behind_and_a_context_comes_with_it():
    size = load_size(shape(), LoadOptions(n_ctx=4096))
    assert size.weights == 4 * 100 * MiB + 60 * MiB
    assert size.context == CUDA_CONTEXT
    tied = load_size(shape(tied=True, token_embd=50 * MiB), LoadOptions(n_ctx=4096))
    assert tied.weights == size.weights + 50 * MiB
    # -ngl 2: the last two of the five layers, the output layer one of them.
    two = load_size(shape(), LoadOptions(n_ctx=4096, n_gpu_layers=2))
    assert two.weights == 100 * MiB + 60 * MiB
    assert two.kv == size.kv // 4
    assert load_size(shape(), LoadOptions(n_ctx=4096, n_gpu_layers=0)).total < size.total


def test_sliding_window_layers_hold_only_their_window():
    gemma = shape(arch="gemma3", n_layer=6, n_head_kv=(4,) * 6, layer_bytes=(MiB,) * 6,
                  n_swa=1024, swa_pattern=6)  # fmt: skip
    size = load_size(gemma, LoadOptions(n_ctx=32768, n_parallel=1, unified=False))
    per_cell = 4 * (64 + 64) * 2
    # Five sliding layers of 1024 + 512 cells, one global layer of the whole context.
    assert size.kv == 5 * 1536 * per_cell + 32768 * per_cell


def test_fit_cuts_an_unset_context_and_the_cap_is_a_context_that_fits():
    options = LoadOptions()
    floor, ceiling = fitted(shape(), options, ctx_set=False)
    assert ceiling.n_ctx == 32768 and floor.n_ctx == FIT_MIN_CTX
    assert floor.total < ceiling.total
    assert fitted(shape(), options, ctx_set=True) == (ceiling, ceiling)
    middle = (floor.total + ceiling.total) // 2
    context = fit_context(shape(), options, middle)
    assert FIT_MIN_CTX < context < 32768 and context % 256 == 0
    assert load_size(shape(), attrs.evolve(options, n_ctx=context)).total <= middle
    assert load_size(shape(), attrs.evolve(options, n_ctx=context + 256)).total > middle
    assert fit_context(shape(), options, 1 * GiB // 1024) == FIT_MIN_CTX
