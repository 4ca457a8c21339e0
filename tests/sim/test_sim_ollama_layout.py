"""How a split runner's layers and bytes are laid over its GPUs (gpugate_sim.ollama.layout),
checked against llama.cpp's own float32 arithmetic and by hand."""

from __future__ import annotations

import bisect

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from gpugate.core.units import GiB, MiB
from gpugate_sim.ollama.layout import lay_out, layer_devices, split_bytes
from gpugate_sim.ollama.placement import GpuMemory, Placement, ollama_view, select


def llama_cpp_devices(layers: int, free: list[int]) -> list[int] | None:
    """src/llama-model.cpp `load_tensors` in float32: split points are the running sums of
    free memory over their total, and layer il goes to std::upper_bound(il / layers).
    None when a layer sits on or within float32's reach of a split point, where rounding
    decides and the simulation's exact comparison may differ."""
    splits = np.zeros(len(free), dtype=np.float32)
    total = np.float32(0)
    for i, nbytes in enumerate(free):
        total = np.float32(total + np.float32(nbytes))
        splits[i] = total
    splits = (splits / total).astype(np.float32)
    counts = [0] * len(free)
    exact_total = sum(free)
    for il in range(layers):
        running = 0
        for nbytes in free:
            running += nbytes
            if abs(running * layers - il * exact_total) * 10**5 <= exact_total * layers:
                return None
        position = np.float32(il) / np.float32(layers)
        device = bisect.bisect_right(splits.tolist(), float(position))
        counts[min(device, len(free) - 1)] += 1
    return counts


@settings(max_examples=300, deadline=None)
@given(
    layers=st.integers(min_value=1, max_value=129),
    free=st.lists(st.integers(min_value=1, max_value=48 * 1024), min_size=2, max_size=4),
)
def test_the_layer_split_is_llama_cpps_away_from_exact_boundaries(
    layers: int, free: list[int]
) -> None:
    # Free memory in MiB steps keeps float32 close to exact, as for real cards.
    in_bytes = [f * MiB for f in free]
    expected = llama_cpp_devices(layers, in_bytes)
    if expected is not None:
        assert list(layer_devices(layers, in_bytes)) == expected


def test_layers_follow_the_free_memory_by_hand() -> None:
    # 41 layers, 16 and 24 GiB free: GPU 0 takes il with 16 * 41 > il * 40, il 0..16.
    assert layer_devices(41, [16 * GiB, 24 * GiB]) == (17, 24)
    # A card with nothing free takes no layer; with nothing free anywhere, an even split.
    assert layer_devices(10, [0, 8 * GiB]) == (0, 10)
    assert layer_devices(10, [0, 0]) == (5, 5)


def test_bytes_go_with_the_layers_and_the_remainder_with_the_last_layer() -> None:
    shares = split_bytes(10 * GiB + 7, 41, [16 * GiB, 24 * GiB])
    assert shares == ((10 * GiB + 7) * 17 // 41, (10 * GiB + 7) - (10 * GiB + 7) * 17 // 41)
    assert sum(shares) == 10 * GiB + 7


def test_one_whole_layer_too_many_for_a_card_caps_that_card_only() -> None:
    # 3 layers over two cards with 10 GiB free each: layers 0 and 1 go to GPU 0 (2/3 of
    # the bytes), which then does not fit there although the total does. llama-server's
    # --fit would move a layer; the simulation keeps the margin free on that card and the
    # rest in system memory.
    layout = lay_out(
        (0, 1), (10 * GiB, 10 * GiB), size=18 * GiB, block_count=2, explicit=None,
        fit_margin=256 * MiB,
    )  # fmt: skip
    assert layout.shares == ((0, 10 * GiB - 256 * MiB), (1, 6 * GiB))
    assert layout.gpu_layers == 2 * layout.vram // (18 * GiB)


def test_an_explicit_layer_count_is_split_the_same_way() -> None:
    # num_gpu 16 of 32 blocks: half the model, its 16 layers by free memory (1:3).
    layout = lay_out(
        (0, 1), (4 * GiB, 12 * GiB), size=8 * GiB, block_count=32, explicit=4 * GiB,
        fit_margin=0,
    )  # fmt: skip
    assert layout.gpu_layers == 16
    assert layout.shares == ((0, 1 * GiB), (1, 3 * GiB))


def test_a_model_within_a_card_but_above_80_percent_of_it_is_split() -> None:
    gpus = [GpuMemory(0, 16 * GiB, 16 * GiB), GpuMemory(1, 16 * GiB, 16 * GiB)]
    # 12.8 GiB is 80 % of 16: at it, one card; a byte over, both.
    at = select(gpus, 16 * GiB * 80 // 100, num_gpu=-1, main_gpu=None, spread=False)
    over = select(gpus, 16 * GiB * 80 // 100 + 1, num_gpu=-1, main_gpu=None, spread=False)
    assert at == Placement((0,), main_gpu=0)
    assert over == Placement((0, 1)) and over.split


def test_ollamas_view_is_the_smaller_of_driver_free_and_total_less_its_own() -> None:
    gpus = [GpuMemory(0, 16 * GiB, 9 * GiB), GpuMemory(1, 16 * GiB, 16 * GiB)]
    assert ollama_view(gpus, {}) == tuple(gpus)
    seen = ollama_view(gpus, {0: 4 * GiB, 1: 10 * GiB})
    assert [g.free for g in seen] == [9 * GiB, 6 * GiB]
    assert ollama_view(gpus, {0: 20 * GiB})[0].free == 0
