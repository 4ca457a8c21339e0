"""Ollama's placement among its GPUs as the gate predicts it (runtimes/ollama/placement.py),
each case one of sched.go's `selectLlamaServerPlacement` rules."""

from __future__ import annotations

import hypothesis.strategies as st
import pytest
from hypothesis import given, settings

from gpugate.core.placement import Card, Share
from gpugate.core.units import GiB, MiB
from gpugate.runtimes.ollama.placement import OllamaPlacement, from_options
from gpugate_sim.ollama.layout import split_bytes
from gpugate_sim.ollama.placement import GpuMemory, select

TWO = [Card(0, 24 * GiB, 20 * GiB), Card(1, 16 * GiB, 15 * GiB)]


def test_one_gpu_where_it_fits_in_80_percent_with_the_most_free_memory():
    assert OllamaPlacement().place(8 * GiB, TWO) == (Share(0, 8 * GiB),)
    # 17 GiB: 80 % of 20 is 16, of 15 is 12 — it fits neither, so it is split.
    assert len(OllamaPlacement().place(17 * GiB, TWO) or ()) == 2
    # 12 GiB fits GPU 1 only when GPU 0 has less free memory than GPU 1.
    cards = [Card(0, 24 * GiB, 10 * GiB), Card(1, 16 * GiB, 15 * GiB)]
    assert OllamaPlacement().place(12 * GiB, cards) == (Share(1, 12 * GiB),)


def test_equal_free_memory_keeps_the_earlier_gpu():
    cards = [Card(0, 16 * GiB, 10 * GiB), Card(1, 16 * GiB, 10 * GiB)]
    assert OllamaPlacement().place(4 * GiB, cards) == (Share(0, 4 * GiB),)


def test_the_80_percent_edge():
    cards = [Card(0, 16 * GiB, 10 * GiB), Card(1, 16 * GiB, 5 * GiB)]
    assert OllamaPlacement().place(8 * GiB, cards) == (Share(0, 8 * GiB),)
    assert len(OllamaPlacement().place(8 * GiB + 1, cards) or ()) == 2


def test_a_split_shares_by_free_memory_in_whole_layers():
    shares = OllamaPlacement(layers=48).place(30 * GiB, TWO)
    assert shares is not None and [s.gpu for s in shares] == [0, 1]
    assert sum(s.bytes for s in shares) == 30 * GiB
    # 49 offloaded layers (48 blocks and the output) at split point 20/35: layer il goes
    # to GPU 0 while 20 * 49 > il * 35, so layers 0..27 (28 of them), and 21 to GPU 1.
    assert shares[0].bytes == 30 * GiB * 28 // 49
    plain = OllamaPlacement().place(30 * GiB, TWO)
    assert plain is not None and plain[0].bytes == 30 * GiB * 20 // 35


def test_too_big_for_every_gpu_together_is_none():
    assert OllamaPlacement().place(36 * GiB, TWO) is None


def test_main_gpu_and_spread_and_cpu_only():
    assert OllamaPlacement(main_gpu=1).place(2 * GiB, TWO) == (Share(1, 2 * GiB),)
    spread = OllamaPlacement(spread=True).place(2 * GiB, TWO)
    assert spread is not None and [s.gpu for s in spread] == [0, 1]
    assert OllamaPlacement(num_gpu=0).place(0, TWO) is None


@pytest.mark.parametrize(
    ("options", "main_gpu", "num_gpu"),
    [
        ("", None, None),
        ("num_ctx=8192,main_gpu=1", 1, None),
        ("num_gpu=-1", None, None),
        ("num_gpu=0", None, 0),
        ('main_gpu="x"', None, None),
    ],
)
def test_options_are_read_from_the_runner_options(options, main_gpu, num_gpu):
    rule = from_options(options, spread=False, layers=None)
    assert (rule.main_gpu, rule.num_gpu) == (main_gpu, num_gpu)


def test_a_main_gpu_outside_the_list_places_nothing():
    assert OllamaPlacement(main_gpu=2).place(2 * GiB, TWO) is None
    assert OllamaPlacement(main_gpu=-1).place(2 * GiB, TWO) is None


cards_st = st.lists(st.integers(0, 24 * 1024), min_size=2, max_size=4)


@settings(max_examples=300, deadline=None)
@given(cards_st, st.integers(1, 48 * 1024), st.integers(1, 80), st.booleans())
def test_the_prediction_is_the_simulated_ollama_s_placement(free_mib, size_mib, blocks, spread):
    """The gate's prediction against the simulator's model of the same rules (sched.go's
    choice, llama.cpp's layer split), wherever the simulated runner would load it whole."""
    cards = [Card(i, 24 * GiB, mib * MiB) for i, mib in enumerate(free_mib)]
    size = size_mib * MiB
    predicted = OllamaPlacement(spread=spread, layers=blocks).place(size, cards)
    memory = [GpuMemory(c.gpu, c.total, c.free) for c in cards]
    chosen = select(memory, size, num_gpu=-1, main_gpu=None, spread=spread)
    free = [c.free for c in cards if c.gpu in chosen.gpus]
    if len(chosen.gpus) == 1:
        assert predicted == (Share(chosen.gpus[0], size),)
        return
    parts = split_bytes(size, blocks + 1, free)
    if any(part > room for part, room in zip(parts, free, strict=True)):
        assert predicted is None  # the runner would keep part of it in system memory
        return
    expected = tuple(Share(g, b) for g, b in zip(chosen.gpus, parts, strict=True) if b)
    assert predicted == expected
