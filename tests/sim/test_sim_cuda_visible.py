"""CUDA_VISIBLE_DEVICES in the simulated process runtimes: the card a process runs on is the
first one the variable shows it, as the gate starts them; a process shown no card behaves
as its real program does (ggml ones fall back to the CPU, PyTorch ones stop)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from gpugate.core.units import GiB, MiB
from gpugate_sim.comfyui import SimComfyUI
from gpugate_sim.comfyui.server import NoCudaDevice
from gpugate_sim.cuda import NO_DEVICE_GGML, NO_DEVICE_TORCH, parse_visible
from gpugate_sim.device import SimDevice, SimulatedGpuHost
from gpugate_sim.scenario import ComfyUISpec
from gpugate_sim.serverprocess import child_env
from gpugate_sim.vllm import SimVllm, VllmServerSpec, VllmStartError
from gpugate_sim.whisper import SimWhisper, WhisperServerSpec
from tests.ports import free_ports

TURBO = "models/ggml-large-v3-turbo.bin"
TURBO_BYTES = 2050 * MiB
UUIDS = ("GPU-8f3e2a71-4c5d-4b9e-a1f0-2d6c7e9b4a13", "GPU-1b7d9c24-6e0f-4a83-9d52-7c4e1f8a0b66")
WAIT = 20.0


@pytest.fixture
def host(tmp_path: Path) -> Iterator[SimulatedGpuHost]:
    yield SimulatedGpuHost.create(
        tmp_path / "gpu",
        [
            SimDevice(0, 24 * GiB, 0, UUIDS[0], "NVIDIA GeForce RTX 4090"),
            SimDevice(1, 16 * GiB, 0, UUIDS[1], "NVIDIA GeForce RTX 4080"),
        ],
    )


def env_with(value: str) -> dict[str, str]:
    return {**os.environ, "CUDA_VISIBLE_DEVICES": value}


def held(host: SimulatedGpuHost, pid: int) -> tuple[int, int]:
    state = host.read()
    return state.held_by(pid, 0), state.held_by(pid, 1)


# -- reading the variable ----------------------------------------------------------------


def test_the_variable_is_read_as_the_cuda_runtime_reads_it(host: SimulatedGpuHost) -> None:
    devices = host.read().devices

    def seen(value: str | None) -> tuple[int, ...]:
        return parse_visible(value, devices).host

    assert seen(None) == (0, 1)
    assert seen("1") == (1,) and seen("1,0") == (1, 0) and seen(" 1 , 0 ") == (1, 0)
    # The list ends at the first entry that names no device.
    assert seen("1,7,0") == (1,) and seen("7,1") == () and seen("0,0,1") == (0,)
    assert seen("") == () and seen("-1") == ()
    # UUIDs, whole or a unique prefix.
    assert seen(UUIDS[1]) == (1,) and seen("GPU-1b7d,0") == (1, 0)
    assert seen("GPU-") == () and seen("GPU-zzz") == ()
    assert parse_visible("1,0", devices).host_gpu(0) == 1
    assert parse_visible("1", devices).host_gpu(1) is None


# -- whisper-server ----------------------------------------------------------------------


def whisper(port: int, **changes: object) -> WhisperServerSpec:
    return WhisperServerSpec(
        listen=f"127.0.0.1:{port}", model=TURBO, models={TURBO: TURBO_BYTES},
        **changes,  # type: ignore[arg-type]
    )  # fmt: skip


def test_whisper_runs_on_the_first_card_it_is_shown(host: SimulatedGpuHost) -> None:
    (port,) = free_ports(1)
    sim = SimWhisper(whisper(port), host.directory, env=env_with("1"))
    try:
        sim.start()
        assert held(host, sim.pid) == (0, TURBO_BYTES)
    finally:
        assert sim.stop() == 0
    # -dev counts the cards it is shown: device 1 of "1,0" is host GPU 0.
    sim = SimWhisper(whisper(port, gpu=1), host.directory, env=env_with("1,0"))
    try:
        sim.start()
        assert held(host, sim.pid) == (TURBO_BYTES, 0)
    finally:
        assert sim.stop() == 0
    assert host.read().processes == []


def test_whisper_shown_no_card_serves_from_the_cpu(host: SimulatedGpuHost) -> None:
    (port,) = free_ports(1)
    sim = SimWhisper(whisper(port), host.directory, env=env_with("5"))
    try:
        sim.start()
        assert held(host, sim.pid) == (0, 0) and host.read().processes == []
    finally:
        assert sim.stop() == 0
    assert sim.stderr_lines[0] == NO_DEVICE_GGML
    assert "whisper_backend_init_gpu: no GPU found" in sim.stderr_lines
    assert any(" CPU total size = " in line for line in sim.stderr_lines)


# -- llama-server ------------------------------------------------------------------------


@pytest.fixture
def gguf(tmp_path: Path) -> Path:
    gguf_models = pytest.importorskip("tests.llamaserver.gguf_models")
    return gguf_models.write_tiny_llama(tmp_path / "tiny.gguf")


def llama_server(
    host: SimulatedGpuHost, gguf: Path, port: int, visible: str, *args: str
) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "gpugate_sim.llamaserver", "-m", str(gguf), "--port", str(port),
         *args, "--sim-state-dir", str(host.directory), "--sim-model-size", "tiny.gguf=1GiB"],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        text=True, env=child_env(env_with(visible)),
    )  # fmt: skip


def serving_model(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1.0) as answer:
            return bool(answer.status == 200)
    except OSError:
        return False


def wait_healthy(proc: subprocess.Popen[str], port: int) -> None:
    deadline = time.monotonic() + WAIT
    while not serving_model(port):
        assert proc.poll() is None, f"exited with {proc.returncode}"
        assert time.monotonic() < deadline, "no healthy llama-server"
        time.sleep(0.02)


@pytest.mark.parametrize(
    ("visible", "args", "on"),
    [("1", ("-dev", "CUDA0"), 1), ("1", (), 1), ("1,0", ("-dev", "CUDA1"), 0)],
    ids=["dev-CUDA0", "no-dev", "dev-CUDA1"],
)
def test_llama_server_runs_on_the_card_its_device_is(
    host: SimulatedGpuHost, gguf: Path, visible: str, args: tuple[str, ...], on: int
) -> None:
    (port,) = free_ports(1)
    proc = llama_server(host, gguf, port, visible, *args)
    try:
        wait_healthy(proc, port)
        bytes_on = held(host, proc.pid)
        assert bytes_on[on] > 0 and bytes_on[1 - on] == 0
    finally:
        proc.terminate()
        assert proc.wait(timeout=WAIT) == 0
    assert host.read().processes == []


def test_llama_server_refuses_a_device_it_is_not_shown(host: SimulatedGpuHost, gguf: Path) -> None:
    (port,) = free_ports(1)
    proc = llama_server(host, gguf, port, "", "-dev", "CUDA0")
    _, err = proc.communicate(timeout=WAIT)
    assert proc.returncode == 1
    assert err.splitlines() == [
        NO_DEVICE_GGML,
        'error while handling argument "-dev": invalid device: CUDA0',
    ]


def test_llama_server_shown_no_card_serves_from_the_cpu(host: SimulatedGpuHost, gguf: Path) -> None:
    (port,) = free_ports(1)
    proc = llama_server(host, gguf, port, "")
    try:
        wait_healthy(proc, port)
        assert host.read().processes == []
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=WAIT)
    assert err.splitlines()[0] == NO_DEVICE_GGML


# -- vLLM --------------------------------------------------------------------------------


def vllm(port: int) -> VllmServerSpec:
    return VllmServerSpec(
        listen=f"127.0.0.1:{port}", context=500 * MiB, overhead=512 * MiB,
        weights=1200 * MiB, gpu_memory_utilization=0.25,
    )  # fmt: skip


def test_vllm_runs_on_the_first_card_it_is_shown(host: SimulatedGpuHost) -> None:
    (port,) = free_ports(1)
    sim = SimVllm(vllm(port), host.directory, env=env_with("1,0"))
    try:
        sim.start()
        assert held(host, sim.pid) == (0, 4 * GiB)  # a quarter of the 4080's 16 GiB
    finally:
        assert sim.stop() == 0


def test_vllm_shown_no_card_stops_at_start(host: SimulatedGpuHost) -> None:
    (port,) = free_ports(1)
    sim = SimVllm(vllm(port), host.directory, env=env_with("9"))
    with pytest.raises(VllmStartError) as caught:
        sim.start()
    assert caught.value.returncode == 1
    assert sim.stderr_lines[-1] == NO_DEVICE_TORCH
    assert host.read().processes == []


# -- ComfyUI -----------------------------------------------------------------------------


async def test_comfyui_cuda_device_picks_the_card_whatever_it_inherited(
    host: SimulatedGpuHost,
) -> None:
    # main.py sets CUDA_VISIBLE_DEVICES from --cuda-device itself.
    comfy = SimComfyUI(ComfyUISpec(gpu=1), host, environ={"CUDA_VISIBLE_DEVICES": "0"})
    try:
        url = await comfy.start("127.0.0.1", 0)
        assert held(host, comfy.pid) == (0, 210 * MiB)
        async with aiohttp.ClientSession() as session, session.get(f"{url}/system_stats") as r:
            stats = await r.json()
    finally:
        await comfy.close()
    (device,) = stats["devices"]
    # PyTorch numbers the cards it sees: the 4080 is its cuda:0.
    assert device["name"] == "cuda:0 NVIDIA GeForce RTX 4080 : cudaMallocAsync"
    assert (device["index"], device["vram_total"]) == (0, 16 * GiB)
    assert stats["system"]["argv"][-2:] == ["--cuda-device", "1"]


async def test_comfyui_without_cuda_device_follows_the_inherited_variable(
    host: SimulatedGpuHost,
) -> None:
    comfy = SimComfyUI(ComfyUISpec(), host, environ={"CUDA_VISIBLE_DEVICES": UUIDS[1]})
    try:
        await comfy.start("127.0.0.1", 0)
        assert held(host, comfy.pid) == (0, 210 * MiB)
        assert "--cuda-device" not in comfy.argv
    finally:
        await comfy.close()
    blind = SimComfyUI(ComfyUISpec(), host, environ={"CUDA_VISIBLE_DEVICES": "7"})
    with pytest.raises(NoCudaDevice, match=r"^No CUDA GPUs are available$"):
        await blind.start("127.0.0.1", 0)
    assert host.read().processes == []
