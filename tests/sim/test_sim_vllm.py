"""The simulated `vllm serve` as a process: memory before the port, the refusal, exit, host."""

from __future__ import annotations

import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml

from gpugate.core.units import GiB, MiB
from gpugate_sim.device import SimDevice, SimProcess, SimulatedGpuHost
from gpugate_sim.host import SimulatedHost
from gpugate_sim.scenario import load_host
from gpugate_sim.vllm import SimVllm, VllmServerSpec, VllmStartError
from tests.ports import free_ports
from tests.sim.processes import cmdline, comm

WAIT = 20.0
CONTEXT, OVERHEAD, WEIGHTS = 500 * MiB, 512 * MiB, 1200 * MiB


def card(tmp_path: Path, total: int = 16 * GiB) -> SimulatedGpuHost:
    return SimulatedGpuHost.create(
        tmp_path / "gpu", [SimDevice(index=0, total=total, reserved=0, uuid="GPU-v", name="sim")]
    )


def spec(port: int = 0, **changes: object) -> VllmServerSpec:
    values: dict[str, object] = {
        "listen": f"127.0.0.1:{port}",
        "model": "Qwen/Qwen3-0.6B",
        "context": CONTEXT,
        "overhead": OVERHEAD,
        "weights": WEIGHTS,
    }
    values.update(changes)
    return VllmServerSpec(**values)  # type: ignore[arg-type]


def held(gpu: SimulatedGpuHost, pid: int) -> int:
    return gpu.read().held_by(pid, 0)


def refused(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) != 0


@pytest.fixture
def gpu(tmp_path: Path) -> Iterator[SimulatedGpuHost]:
    yield card(tmp_path)


def test_it_takes_the_fraction_of_the_total_before_it_serves(gpu: SimulatedGpuHost) -> None:
    (port,) = free_ports(1)
    sim = SimVllm(spec(port, load_seconds=1.0, gpu_memory_utilization=0.5), gpu.directory)
    sim.spawn()
    try:
        deadline = time.monotonic() + WAIT
        while held(gpu, sim.pid) < CONTEXT + WEIGHTS:
            assert time.monotonic() < deadline, "the weights never arrived"
            time.sleep(0.01)
        assert refused(port), "the port must refuse while the engine starts"
        assert sim.wait_serving() == f"http://127.0.0.1:{port}"
        # Weights are 1200 MiB; the KV cache fills the rest of 0.5 x 16 GiB.
        assert held(gpu, sim.pid) == 8 * GiB
        assert gpu.read().processes[0].name == "vllm"
    finally:
        assert sim.stop() == 0
    assert gpu.read().processes == []


def test_the_default_utilization_is_nine_tenths_of_the_total(gpu: SimulatedGpuHost) -> None:
    with SimVllm(spec(), gpu.directory) as sim:
        assert held(gpu, sim.pid) == int(16 * GiB * 0.9)


def test_it_refuses_to_start_when_less_than_the_fraction_is_free(
    gpu: SimulatedGpuHost,
) -> None:
    with subprocess.Popen(["sleep", "600"]) as other:
        try:
            gpu.add_process(SimProcess(0, other.pid, 10 * GiB, "C", "other"))
            sim = SimVllm(spec(), gpu.directory)
            with pytest.raises(VllmStartError) as failed:
                sim.start()
            assert failed.value.returncode == 1
            assert (
                "ValueError: Free memory on device cuda:0 (5.51/16.0 GiB) on startup is less "
                "than desired GPU memory utilization (0.9, 14.4 GiB). Decrease GPU memory "
                "utilization or reduce GPU memory used by other processes."
            ) in sim.stderr_lines
            assert sim.stderr_lines[-1].startswith(
                "RuntimeError: Engine core initialization failed."
            )
            assert [p.pid for p in gpu.read().processes] == [other.pid]
        finally:
            other.kill()


def test_a_model_len_the_kv_cache_cannot_hold_is_refused(gpu: SimulatedGpuHost) -> None:
    sim = SimVllm(
        spec(gpu_memory_utilization=0.2, max_model_len=131072, kv_bytes_per_token=128 * 1024),
        gpu.directory,
    )
    with pytest.raises(VllmStartError):
        sim.start()
    line = next(x for x in sim.stderr_lines if "max seq len" in x)
    assert line.startswith(
        "ValueError: To serve at least one request with the models's max seq len (131072), "
        "(16.0 GiB KV cache is needed, which is larger than the available KV cache memory"
    )
    assert gpu.read().processes == []


def test_it_shows_as_vllm_serve_without_the_sim_options(gpu: SimulatedGpuHost) -> None:
    names = ("qwen", "small")
    with SimVllm(spec(served_model_names=names, enable_sleep_mode=True), gpu.directory) as sim:
        words = cmdline(sim.pid)
        assert words[:3] == ["vllm", "serve", "Qwen/Qwen3-0.6B"]
        assert not any(w.startswith("--sim-") for w in words)
        assert words[words.index("--served-model-name") + 1 :][:2] == list(names)
        assert "--enable-sleep-mode" in words
        assert comm(sim.pid) == "vllm"


def test_the_host_starts_a_vllm_section(tmp_path: Path) -> None:
    (port,) = free_ports(1)
    host_file = tmp_path / "HOST.yaml"
    host_file.write_text(
        yaml.safe_dump(
            {
                "gpus": [{"total": "16GiB"}],
                "vllm": {
                    "listen": f"127.0.0.1:{port}",
                    "gpu_memory_utilization": 0.25,
                    "enable_sleep_mode": True,
                    "dev_mode": True,
                    "weights": "1200MiB",
                },
            }
        )
    )
    loaded = load_host(host_file)
    assert loaded.vllm is not None and loaded.vllm.dev_mode
    with SimulatedHost(loaded, tmp_path / "state") as host:
        assert host.vllm_url == f"http://127.0.0.1:{port}"
        assert f"vllm at {host.vllm_url}" in host.ready_line()
        assert host.gpu is not None
        assert sum(p.used for p in host.gpu.read().processes) == 4 * GiB
        asleep = httpx.post(f"{host.vllm_url}/sleep?level=1", timeout=WAIT)
        assert asleep.status_code == 200
        assert sum(p.used for p in host.gpu.read().processes) == CONTEXT + OVERHEAD


def test_a_bad_vllm_section_names_the_field(tmp_path: Path) -> None:
    host_file = tmp_path / "HOST.yaml"
    host_file.write_text(yaml.safe_dump({"vllm": {"gpu_memory_utilization": 1.5}}))
    with pytest.raises(ValueError, match=r"vllm\.gpu_memory_utilization"):
        load_host(host_file)
