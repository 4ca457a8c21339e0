"""`python -m gpugate_sim.ollama serve` as the simulated host starts it, and its HOST.yaml."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from gpugate.core.units import GiB, MiB
from gpugate_sim.device import SimulatedGpuHost
from gpugate_sim.scenario import ScenarioError, load_host

HOST_YAML = """\
gpus:
  - name: NVIDIA GeForce RTX 4080
    total: 16GiB
ollama:
  listen: 127.0.0.1:0
  keep_alive: 10m
  num_parallel: 2
  fit_margin: 128MiB
  models:
    - name: gemma3:12b
      size: 7.6GiB
      load_seconds: 20ms
      kv_bytes_per_token: 96KiB
      parameter_size: 12.2B
    - name: bge-m3
      size: 1.2GiB
      embedding: true
      embedding_length: 32
  preload:
    - model: gemma3:12b
      keep_alive: -1
      options: {num_ctx: 8192}
"""


async def wait_exit(pid: int) -> None:
    """Wait for any process (not only a child) to exit, on a pidfd rather than a clock."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    loop = asyncio.get_running_loop()
    gone = loop.create_future()
    loop.add_reader(fd, gone.set_result, None)
    try:
        await asyncio.wait_for(gone, 10)
    finally:
        loop.remove_reader(fd)
        os.close(fd)


@pytest.fixture
async def serve(
    tmp_path: Path, sim_host: SimulatedGpuHost
) -> AsyncIterator[tuple[asyncio.subprocess.Process, str]]:
    host_file = tmp_path / "host.yaml"
    host_file.write_text(HOST_YAML)
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gpugate_sim.ollama", "serve",
        "--host-file", str(host_file), "--state-dir", str(sim_host.directory),
        stdout=asyncio.subprocess.PIPE,
    )  # fmt: skip
    assert proc.stdout is not None
    line = await asyncio.wait_for(proc.stdout.readline(), 30)
    assert line.startswith(b"READY http://127.0.0.1:"), line
    yield proc, line.split()[1].decode()
    if proc.returncode is None:
        proc.kill()
        await proc.wait()


async def test_serve_prints_ready_after_preloading_and_exits_cleanly_on_sigterm(
    serve: tuple[asyncio.subprocess.Process, str], sim_host: SimulatedGpuHost
) -> None:
    proc, url = serve
    cmdline = Path(f"/proc/{proc.pid}/cmdline").read_bytes().replace(b"\0", b" ")
    assert b"ollama serve" in cmdline
    async with aiohttp.ClientSession() as session:
        async with session.get(f"{url}/api/ps") as resp:
            (entry,) = (await resp.json())["models"]
        async with session.get(f"{url}/sim/state") as resp:
            (runner,) = (await resp.json())["runners"]
    assert entry["name"] == "gemma3:12b" and entry["context_length"] == 8192
    assert entry["size"] == round(7.6 * GiB) + 4096 * 96 * 1024
    assert entry["expires_at"] > "2200"
    pid = runner["pid"]
    stat = Path(f"/proc/{pid}/stat").read_text()
    assert int(stat.rsplit(")", 1)[1].split()[1]) == proc.pid
    assert sim_host.read().held_by(pid, 0) == entry["size_vram"] == entry["size"]
    proc.send_signal(signal.SIGTERM)
    assert await asyncio.wait_for(proc.wait(), 10) == 0
    assert not Path(f"/proc/{pid}").exists()
    assert sim_host.read().processes == []


async def test_runners_die_with_a_killed_server(
    serve: tuple[asyncio.subprocess.Process, str], sim_host: SimulatedGpuHost
) -> None:
    proc, url = serve
    async with aiohttp.ClientSession() as session, session.get(f"{url}/sim/state") as resp:
        (runner,) = (await resp.json())["runners"]
    proc.kill()
    await proc.wait()
    await wait_exit(runner["pid"])
    assert sim_host.read().processes == []


async def test_serve_reports_a_bad_host_file_and_exits_2(
    tmp_path: Path, sim_host: SimulatedGpuHost
) -> None:
    host_file = tmp_path / "host.yaml"
    host_file.write_text(HOST_YAML.replace("size: 1.2GiB", "size: lots"))
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gpugate_sim.ollama", "serve",
        "--host-file", str(host_file), "--state-dir", str(sim_host.directory),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode == 2 and out == b""
    assert str(host_file).encode() in err and b"ollama.models[1].size" in err


def test_host_file_ollama_section_is_read_with_its_knobs(tmp_path: Path) -> None:
    host_file = tmp_path / "host.yaml"
    host_file.write_text(HOST_YAML)
    spec = load_host(host_file).ollama
    assert spec is not None
    assert (spec.num_parallel, spec.fit_margin, spec.keep_alive) == (2, 128 * MiB, "10m")
    gemma, bge = spec.models
    assert gemma.load_seconds == pytest.approx(0.02) and gemma.kv_bytes_per_token == 96 * 1024
    assert bge.embedding and bge.embedding_length == 32
    (preload,) = spec.preload
    assert (preload.keep_alive, preload.options) == ("-1", {"num_ctx": 8192})


@pytest.mark.parametrize(
    ("change", "field"),
    [
        (("keep_alive: 10m", "keep_alive: soon"), "ollama.keep_alive"),
        (("num_parallel: 2", "num_parallel: 0"), "ollama.num_parallel"),
        (("embedding: true", "embedding: yes please"), "ollama.models[1].embedding"),
        (("- model: gemma3:12b", "- model: llama9"), "ollama.preload[0].model"),
        (("keep_alive: -1", "keep_alive: forever"), "ollama.preload[0].keep_alive"),
        (("load_seconds: 20ms", "load_seconds: later"), "ollama.models[0].load_seconds"),
    ],
)
def test_host_file_errors_name_the_field(
    tmp_path: Path, change: tuple[str, str], field: str
) -> None:
    host_file = tmp_path / "host.yaml"
    host_file.write_text(HOST_YAML.replace(*change))
    with pytest.raises(ScenarioError) as caught:
        load_host(host_file)
    assert str(caught.value).startswith(f"{host_file}: {field}")
