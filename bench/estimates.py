"""First loads: what the gate estimates a model's load takes, against what the load took.

For every model `gpugate demo` loads through Ollama (the incident host's four, each from
its GGUF blob, and again from what /api/show says of it where the gate cannot read the
blob) the simulated Ollama loads it alone and NVML's figure for its runner is the
measure. For the tiny GGUF models the llama-server tests load, the simulated llama-server
holds them on a simulated card (NVML's figure for its process), and the real one (its CPU
build) logs its buffers (`model`, `KV` and `compute buffer size`), which are the measure
there: on a CPU build no CUDA context is held, and the estimate leaves it out.

    python -m bench.estimates [BUILD/llama-server]

prints the table; tests/e2e/test_first_load_estimates.py holds every row within 10 %.
"""

from __future__ import annotations

import asyncio
import json
import re
import shlex
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import aiohttp
import attrs
import yaml

from gpugate.core.units import GiB, MiB
from gpugate.runtimes.footprint import Cards
from gpugate.runtimes.gguf import read_file
from gpugate.runtimes.llamacpp import header_shape, load_size
from gpugate.runtimes.llamaserver.memory import Launch, footprint
from gpugate.runtimes.ollama.memory import OllamaMemory, show_shape
from gpugate.runtimes.ollama.names import canonical_name
from gpugate.runtimes.registry import runtime_for
from gpugate.runtimes.sections import load_config_text
from gpugate_sim.device import SimulatedGpuHost
from gpugate_sim.hostprocess import SimulatedHostProcess
from tests.gate.harness import free_ports
from tests.llamaserver.gguf_models import write_tiny_llama

ROOT = Path(__file__).resolve().parents[1]
INCIDENT = ROOT / "gpugate_sim" / "data" / "incident-2026-07-10.yaml"
LLAMA_SERVER = ROOT / "build" / "llama-server"
TOLERANCE = 0.10
TEST_ARGS = "-c 512 -np 1"
"""The context and slots the llama-server tests run their models with (conftest.py)."""


@attrs.frozen
class Row:
    """One model's first load."""

    runtime: str
    model: str
    source: str
    """What the estimate was read from."""
    estimate: int
    measured: int

    @property
    def error(self) -> float:
        return (self.estimate - self.measured) / self.measured

    @property
    def within(self) -> bool:
        return abs(self.error) <= TOLERANCE


def table(rows: list[Row]) -> str:
    """The rows as a Markdown table."""
    lines = [
        "| runtime | model | estimated from | estimate | measured | error |",
        "|---|---|---|---:|---:|---:|",
    ]
    for row in rows:
        lines.append(
            f"| {row.runtime} | {row.model} | {row.source} | {row.estimate / MiB:,.2f} MiB "
            f"| {row.measured / MiB:,.2f} MiB | {100 * row.error:+.1f} % |"
        )
    return "\n".join(lines)


# -- Ollama: the demo's models on the simulated incident host ------------------------------


def _ollama_only_host(work: Path) -> tuple[Path, int]:
    """The incident host with only its card, its holders and Ollama (on a free port)."""
    data = yaml.safe_load(INCIDENT.read_text())
    (port,) = free_ports(1)
    host = {key: data[key] for key in ("driver", "cuda", "gpus", "holders")}
    host["ollama"] = {**data["ollama"], "listen": f"127.0.0.1:{port}", "preload": []}
    work.mkdir(parents=True, exist_ok=True)
    path = work / "incident-ollama.yaml"
    path.write_text(yaml.safe_dump(host))
    return path, port


def _post(url: str, body: dict[str, object]) -> dict[str, object]:
    request = urllib.request.Request(
        url, json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=120) as resp:
            return json.loads(resp.read() or b"{}")
    except urllib.error.HTTPError as exc:
        raise RuntimeError(f"{url} answered {exc.code}: {exc.read()[:300]!r}") from None


def _get(url: str) -> dict[str, object]:
    with urllib.request.urlopen(url, timeout=30) as resp:
        return json.loads(resp.read())


def _ollama_memory(url: str) -> OllamaMemory:
    config = load_config_text(
        f"consumers:\n  ollama:\n    runtime: ollama\n    listen: 127.0.0.1:1\n"
        f"    upstream: {url}\n",
        "consumers.yaml",
    )
    runtime = runtime_for(config.consumers[0])
    assert runtime is not None and isinstance(runtime.memory, OllamaMemory)
    return runtime.memory


async def _estimates(url: str, models: list[str], cards: Cards) -> dict[str, tuple[int, int]]:
    """Each model's estimate from its blob and from /api/show alone."""
    memory = _ollama_memory(url)
    found = {}
    async with aiohttp.ClientSession() as session:
        for model in models:
            key = canonical_name(model) or model
            blob = await memory.estimate(session, key, "", cards)
            assert blob is not None, model
            async with session.post(url + "/api/show", json={"model": key}) as resp:
                show = await resp.json()
            shape = show_shape(show)
            assert shape is not None, model
            found[model] = (blob.ceiling, memory.load(shape, {}, "", cards).total)
    return found


def ollama_rows(work: Path) -> list[Row]:
    """The incident host's Ollama models, each loaded alone."""
    host_file, port = _ollama_only_host(work)
    url = f"http://127.0.0.1:{port}"
    specs = yaml.safe_load(host_file.read_text())["ollama"]["models"]
    models = [m["name"] for m in specs]
    embedding = {m["name"] for m in specs if m.get("embedding")}
    state_dir = work / "state"
    rows = []
    with SimulatedHostProcess(host_file, state_dir) as _host:
        gpu = SimulatedGpuHost(state_dir)
        cards = Cards(tuple(d.total for d in gpu.read().devices))
        estimates = asyncio.run(_estimates(url, models, cards))
        for model in models:
            # A load alone: an empty prompt (or input, for an embedding model).
            if model in embedding:
                _post(url + "/api/embed", {"model": model, "input": [], "keep_alive": -1})
            else:
                _post(url + "/api/generate", {"model": model, "keep_alive": -1})
            shown = canonical_name(model) or model
            runner = next(r for r in _get(url + "/sim/state")["runners"] if r["model"] == shown)
            measured = gpu.read().held_by(int(runner["pid"]), 0)
            _post(url + "/api/generate", {"model": model, "keep_alive": 0})
            _wait_gone(gpu, int(runner["pid"]))
            blob, show = estimates[model]
            rows.append(Row("ollama", model, "GGUF blob", blob, measured))
            rows.append(Row("ollama", model, "/api/show", show, measured))
    return rows


def _wait_gone(gpu: SimulatedGpuHost, pid: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while gpu.read().held_by(pid, 0) and time.monotonic() < deadline:
        time.sleep(0.05)


# -- llama-server: the tests' tiny models -------------------------------------------------


def test_models(work: Path) -> dict[str, Path]:
    """The tiny GGUF models the llama-server tests load (tests/llamaserver/gguf_models.py),
    and one with a long trained context that `--fit` may cut."""
    return {
        "tiny": write_tiny_llama(work / "tiny.gguf"),
        "tiny, embedding": write_tiny_llama(work / "embed.gguf", embedding=True),
        "tiny, FIM tokens": write_tiny_llama(work / "fim.gguf", fim=True),
        "wider, 4k context": write_tiny_llama(
            work / "wide.gguf", n_embd=256, n_ff=1024, n_head=8, context_length=4096
        ),
    }


def _option(argv: list[str]):
    def option(*names: str) -> str | None:
        found = None
        for i, word in enumerate(argv):
            if word in names and i + 1 < len(argv):
                found = argv[i + 1]
        return found

    return option


@contextmanager
def _running(argv: list[str], log: Path, env: dict[str, str] | None = None) -> Iterator[None]:
    (port,) = free_ports(1)
    with log.open("w") as sink:
        proc = subprocess.Popen(
            [*argv, "--host", "127.0.0.1", "--port", str(port)],
            stdout=sink, stderr=subprocess.STDOUT, env=env,
        )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if proc.poll() is not None:
                raise RuntimeError(f"{argv[0]} exited: {log.read_text()[-2000:]}")
            time.sleep(0.1)
        else:
            raise RuntimeError(f"{argv[0]} did not answer: {log.read_text()[-2000:]}")
        yield
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


BUFFER = re.compile(r"(\S+)\s+(model|KV|compute) buffer size =\s+([\d.]+) MiB")


def logged_buffers(text: str) -> int:
    """The last load's model, KV and compute buffers, as llama-server logs them."""
    last: dict[str, float] = {}
    for _, kind, mib in BUFFER.findall(text):
        last[kind] = float(mib)
    return round(sum(last.values()) * MiB)


def real_rows(binary: Path, work: Path) -> list[Row]:
    """The real llama-server (CPU build) on each test model: its logged buffers."""
    work.mkdir(parents=True, exist_ok=True)
    rows = []
    for name, path in test_models(work).items():
        args = shlex.split(TEST_ARGS if "4k" not in name else "")
        if "embedding" in name:
            args.append("--embeddings")
        log = work / f"real-{path.stem}.log"
        with _running(
            [str(binary), "-m", str(path), "-t", "1", "--log-verbosity", "4", *args], log
        ):
            measured = logged_buffers(log.read_text())
        shape = header_shape(read_file(path))
        assert shape is not None
        options = attrs.evolve(Launch.read(_option(args)).options, on_gpu=False)
        estimate = load_size(shape, options).total
        rows.append(Row("llama-server (real, CPU)", f"{name} {' '.join(args)}".strip(),
                        "GGUF header", estimate, measured))  # fmt: skip
    return rows


def sim_rows(work: Path) -> list[Row]:
    """The simulated llama-server on a 16 GiB simulated card: NVML's figure for it."""
    from gpugate_sim.serverprocess import child_env
    from gpugate_sim.statefile import SimDevice

    device = SimDevice(index=0, total=16 * GiB, reserved=0, uuid="GPU-e", name="sim")
    gpu = SimulatedGpuHost.create(work / "gpu", [device])
    state_dir = gpu.directory
    rows = []
    for name, path in test_models(work).items():
        args = shlex.split(TEST_ARGS if "4k" not in name else "")
        argv = [sys.executable, "-m", "gpugate_sim.llamaserver", "-m", str(path), *args,
                "--sim-state-dir", str(state_dir), "--sim-gpu", "0"]  # fmt: skip
        log = work / f"sim-{path.stem}.log"
        with _running(argv, log, env=child_env()):
            measured = sum(p.used for p in gpu.read().processes)
        found = footprint(str(path), _option(args))
        assert found is not None
        rows.append(Row("llama-server (sim)", f"{name} {' '.join(args)}".strip(),
                        "GGUF header", found.ceiling, measured))  # fmt: skip
    return rows


def all_rows(binary: Path | None = None) -> list[Row]:
    with tempfile.TemporaryDirectory(prefix="gpugate-estimates-") as tmp:
        work = Path(tmp)
        rows = ollama_rows(work / "ollama")
        rows += sim_rows(work / "sim")
        if binary is not None and binary.is_file():
            rows += real_rows(binary, work / "real")
        return rows


if __name__ == "__main__":
    print(table(all_rows(Path(sys.argv[1]) if len(sys.argv) > 1 else LLAMA_SERVER)))
