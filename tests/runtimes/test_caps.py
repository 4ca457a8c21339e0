"""The knob each runtime is told its cap by: its value for a given lease and card, how it
goes onto a command line, and how an operator's own setting of it is kept."""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

import attrs
import pytest

from gpugate.core.units import GiB, MiB
from gpugate.runtimes.comfyui.adapter import reserve_vram
from gpugate.runtimes.footprint import Cap, Knob
from gpugate.runtimes.gguf import read_file
from gpugate.runtimes.llamacpp import FIT_MIN_CTX, KV_PAD, header_shape, load_size
from gpugate.runtimes.llamaserver.catalog import ModelEntry
from gpugate.runtimes.llamaserver.memory import CONTEXT_KNOB, Launch, context_cap
from gpugate.runtimes.process_find import command_pids
from gpugate.runtimes.process_supervised import SupervisedCommand
from gpugate.runtimes.vllm.adapter import utilization_cap
from tests.llamaserver.gguf_models import write_tiny_llama

CARD = 16 * GiB


def test_a_knob_is_found_under_every_name_the_runtime_reads_it_by():
    assert CONTEXT_KNOB.set_in(["llama-server", "-m", "x", "-c", "8192"], {}) == "-c 8192"
    assert CONTEXT_KNOB.set_in(["llama-server", "--ctx-size", "0"], {}) == "--ctx-size 0"
    # llama.cpp reads `--ctx_size` as `--ctx-size` (common_params_parse_ex).
    assert CONTEXT_KNOB.set_in(["llama-server", "--ctx_size", "512"], {}) == "--ctx_size 512"
    assert CONTEXT_KNOB.set_in(["llama-server"], {"LLAMA_ARG_CTX_SIZE": "2048"}) == (
        "LLAMA_ARG_CTX_SIZE=2048"
    )
    # An empty variable sets nothing; another option that starts alike is another option.
    assert CONTEXT_KNOB.set_in(["llama-server", "-cb"], {"LLAMA_ARG_CTX_SIZE": ""}) is None
    share = Knob(("--gpu-memory-utilization",))
    assert share.set_in(["vllm", "serve", "m", "--gpu-memory-utilization=0.5"], {}) == (
        "--gpu-memory-utilization=0.5"
    )
    assert share.set_in(["vllm", "--gpu_memory_utilization", "0.5"], {}) == (
        "--gpu_memory_utilization 0.5"
    )


def test_a_cap_goes_after_the_command_unless_the_command_sets_its_knob():
    cap = Cap(args=("-c", "8192"), knob=CONTEXT_KNOB)
    told = cap.onto(("llama-server", "-m", "x.gguf"), {})
    assert told.argv == ("llama-server", "-m", "x.gguf", "-c", "8192") and told.kept is None
    own = cap.onto(("llama-server", "-m", "x.gguf", "-c", "2048"), {})
    assert own.argv == ("llama-server", "-m", "x.gguf", "-c", "2048") and own.kept == "-c 2048"
    from_env = cap.onto(("llama-server",), {"LLAMA_ARG_CTX_SIZE": "1024"})
    assert from_env.argv == ("llama-server",) and from_env.kept == "LLAMA_ARG_CTX_SIZE=1024"
    # A cap without a knob's names is found by its own first argument.
    bare = Cap(args=("--reserve-vram", "1"))
    assert bare.onto(("main.py", "--reserve-vram", "2"), {}).kept == "--reserve-vram 2"
    assert Cap().onto(("x",), {}).argv == ("x",)
    assert Cap(env=(("A", "1"),)).onto(("x",), {}).env == {"A": "1"}
    assert Cap(env=(("A", "1"),)).onto(("x",), {"A": "2"}).kept == "A=2"


def test_a_llama_server_is_told_the_largest_context_its_lease_holds(tmp_path: Path):
    path = write_tiny_llama(tmp_path / "long.gguf", context_length=32768)
    entry = ModelEntry("long", "unloaded", args=("-m", str(path)))
    shape = header_shape(read_file(path))
    assert shape is not None
    options = Launch.read(entry.option).options
    at_8k = load_size(shape, attrs.evolve(options, n_ctx=8192)).total
    cap = context_cap(str(path), entry.option, at_8k)
    assert cap is not None and cap.args == ("-c", "8192") and cap.knob == CONTEXT_KNOB
    # A byte short of the 8192 load is the next context down, in llama.cpp's steps of 256.
    short = context_cap(str(path), entry.option, at_8k - 1)
    assert short is not None and short.args == ("-c", str(8192 - KV_PAD))
    # A lease of the whole trained context: all of it; less than the least --fit would
    # cut to: that least, --fit-ctx's 4096.
    whole = load_size(shape, attrs.evolve(options, n_ctx=32768)).total
    assert context_cap(str(path), entry.option, whole) == Cap(args=("-c", "32768"))
    assert context_cap(str(path), entry.option, MiB) == Cap(args=("-c", str(FIT_MIN_CTX)))
    assert context_cap(str(tmp_path / "missing.gguf"), entry.option, GiB) is None
    # A model trained on fewer tokens than that least is told its own context, as an
    # unset -c would give it, whatever the lease.
    short_model = write_tiny_llama(tmp_path / "short.gguf", context_length=512)
    for lease in (MiB, GiB):
        assert context_cap(str(short_model), entry.option, lease) == Cap(args=("-c", "512"))


def test_vllm_is_told_the_share_of_the_card_its_lease_is():
    # 13 GiB of a 16 GiB card is 0.8125: rounded down, so its share stays within the lease.
    cap = utilization_cap(13 * GiB, CARD)
    assert cap == Cap(args=("--gpu-memory-utilization", "0.812"))
    assert 13 * GiB >= 0.812 * CARD
    assert utilization_cap(20 * GiB, CARD) == Cap(args=("--gpu-memory-utilization", "1.000"))
    assert utilization_cap(GiB, 0) is None


def test_comfyui_is_told_the_reserve_in_the_gigabytes_it_multiplies_by_1024_cubed():
    assert reserve_vram(GiB) == Cap(args=("--reserve-vram", "1"))
    assert reserve_vram(1536 * MiB) == Cap(args=("--reserve-vram", "1.5"))
    # 1000 MiB is 0.9766 GiB: rounded up, ComfyUI keeps at least the reserve free.
    told = reserve_vram(1000 * MiB)
    assert told.args == ("--reserve-vram", "0.98") and 0.98 * GiB >= 1000 * MiB


SLEEPER = "import time\ntime.sleep(60)\n"


@pytest.fixture
def sleeper(tmp_path: Path) -> list[str]:
    """A program that runs a minute (a script: `python -c` would itself be a `-c`)."""
    script = tmp_path / "sleeper.py"
    script.write_text(SLEEPER)
    return [sys.executable, str(script)]


async def _started(process: SupervisedCommand, cap: Cap) -> tuple[str, ...]:
    """The command line the started process runs, read from /proc."""
    await process.start(cap=cap)
    pid = process.pid
    assert pid is not None
    # The spawn may return (vfork) before the kernel has written the new argv: /proc shows
    # an empty cmdline for that moment.
    cmdline = Path(f"/proc/{pid}/cmdline")
    deadline = time.monotonic() + 10.0
    while not (raw := cmdline.read_bytes()):
        assert time.monotonic() < deadline, f"{pid} never showed its argv"
        await asyncio.sleep(0)
    return tuple(word.decode() for word in raw.split(b"\0")[:-1])


async def test_a_command_the_gate_runs_gets_its_cap_and_is_found_again_with_it(sleeper):
    argv = sleeper
    cap = Cap(args=("-c", "8192"), knob=CONTEXT_KNOB)
    process = SupervisedCommand(argv, stop_grace=2.0)
    try:
        started = await _started(process, cap)
        assert started == (*argv, "-c", "8192")
        assert process.started == started and process.kept is None
        # A later gate finds the child an earlier one started with its cap.
        assert SupervisedCommand(argv).find() == process.pid
        assert command_pids(argv) == [] and command_pids(argv, told=True) == [process.pid]
    finally:
        exit = await process.stop()
    assert exit is not None and exit.stopped
    assert command_pids(argv, told=True) == []


@pytest.mark.parametrize(
    ("extra", "env", "kept"),
    [
        (["-c", "2048"], {}, "-c 2048"),
        ([], {"LLAMA_ARG_CTX_SIZE": "1024"}, "LLAMA_ARG_CTX_SIZE=1024"),
    ],
)
async def test_a_command_that_sets_its_knob_keeps_its_own_value(
    sleeper: list[str], extra: list[str], env: dict[str, str], kept: str
):
    argv = [*sleeper, *extra]
    process = SupervisedCommand(argv, env=env, stop_grace=2.0)
    try:
        started = await _started(process, Cap(args=("-c", "8192"), knob=CONTEXT_KNOB))
        assert started == tuple(argv) and process.kept == kept
    finally:
        await asyncio.wait_for(process.stop(), 30)
    assert command_pids(argv, told=True) == []
