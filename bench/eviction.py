"""Eviction latency on the simulated host: from the runtime's unload answer to the grant
of the request the unload was for, and what of that NVML took to show the bytes back.

    python -m bench.eviction [--rounds N]

A 16 GiB card holds a background embedding model and a 12B model; a 7B request does not
fit until the embedding model goes. The gate asks the simulated Ollama to unload it,
samples NVML until the bytes are back, then grants. Timestamps: the adapter's `evict`
returning (the answer), the first moment the simulated card shows the bytes free (polled
every millisecond in the same process), and the LEASE_GRANTED event.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from pathlib import Path

import aiohttp

from gpugate.core.effects import EventKind
from gpugate.core.units import GiB, MiB
from gpugate.sim.device import SimDevice, SimulatedGpuHost
from gpugate.sim.shim import STATE_ENV, library_path
from tests.gate.harness import running_stack


async def generate(url: str, model: str, embed: bool = False) -> None:
    path, body = (
        ("/api/embed", {"model": model, "input": "x"})
        if embed
        else ("/api/generate", {"model": model, "prompt": "hi", "stream": False})
    )
    async with aiohttp.ClientSession() as session, session.post(url + path, json=body) as resp:
        assert resp.status == 200, await resp.text()
        await resp.read()


async def one_round(tmp: Path) -> dict[str, float]:
    host = SimulatedGpuHost.create(
        tmp / "gpu", [SimDevice(0, 16 * GiB, 434 * MiB, "GPU-eviction", "bench")]
    )
    import os

    os.environ[STATE_ENV] = str(host.state_path)
    async with running_stack(tmp, host, library_path()) as stack:
        await generate(stack.gate_url, "bge-m3", embed=True)
        await generate(stack.gate_url, "gemma3:12b")
        link = stack.gate.links["ollama"]
        residents = link.runtime.residents
        evict = residents.evict
        marks: dict[str, float] = {}

        async def timed_evict(session: object, model: str) -> object:
            result = await evict(session, model)  # type: ignore[arg-type]
            marks["answer"] = time.monotonic()
            return result

        residents.evict = timed_evict  # type: ignore[method-assign]
        before = host.free(0)

        async def watch() -> None:
            while host.free(0) < before + 2012 * MiB * 0.9:
                await asyncio.sleep(0.001)
            marks["nvml"] = time.monotonic()

        watcher = asyncio.create_task(watch())
        granted = stack.next_event(EventKind.LEASE_GRANTED, model="qwen2.5:7b")
        request = asyncio.create_task(generate(stack.gate_url, "qwen2.5:7b"))
        await granted
        marks["grant"] = time.monotonic()
        await request
        await watcher
    return {
        "grant_after_answer_ms": (marks["grant"] - marks["answer"]) * 1000,
        "nvml_after_answer_ms": max(0.0, marks["nvml"] - marks["answer"]) * 1000,
        "grant_after_nvml_ms": (marks["grant"] - max(marks["nvml"], marks["answer"])) * 1000,
    }


async def main(rounds: int) -> dict[str, float]:
    runs = []
    for n in range(rounds):
        with tempfile.TemporaryDirectory(prefix=f"gpugate-evict-{n}-") as tmp:
            runs.append(await one_round(Path(tmp)))
    result: dict[str, float] = {}
    for key in runs[0]:
        values = sorted(run[key] for run in runs)
        result[f"{key}_median"] = statistics.median(values)
        result[f"{key}_max"] = values[-1]
    return result


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=10)
    args = parser.parse_args()
    print(json.dumps(asyncio.run(main(args.rounds)), indent=1))
