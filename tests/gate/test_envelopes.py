"""Envelopes: configured, else measured (and remembered in SQLite), else estimated."""

from __future__ import annotations

import aiohttp
import ollama

from gpugate.core.effects import EventKind
from gpugate.core.units import MiB
from gpugate.runtimes.llamacpp import CUDA_CONTEXT
from tests.gate.harness import running_stack

NO_LLAMA_ENVELOPE = """\
gemma3:12b: {envelope: 7796MiB}
"""


async def tags_size(url: str, model: str) -> int:
    async with aiohttp.ClientSession() as session, session.get(url + "/api/tags") as resp:
        for entry in (await resp.json())["models"]:
            if entry["name"] == model:
                return int(entry["size"])
    raise AssertionError(model)


async def test_estimate_then_measure_then_remember_across_restarts(
    tmp_path, sim_host, fakenvml_path
):
    async with running_stack(
        tmp_path, sim_host, fakenvml_path, models_yaml=NO_LLAMA_ENVELOPE, database=True
    ) as stack:
        client = ollama.AsyncClient(host=stack.gate_url)
        granted = stack.next_event(EventKind.LEASE_GRANTED, model="llama3.2:3b")
        await client.generate(model="llama3.2:3b", prompt="x", options={"num_predict": 1})
        estimate = (await granted).bytes
        # Weights on disk plus runtime overhead (the simulated model reports no KV shape).
        assert estimate == await tags_size(stack.sim_url, "llama3.2:3b") + CUDA_CONTEXT
        # The next listing measures what the runner really holds.
        measured = stack.next_event(EventKind.ENVELOPE_MEASURED, model="llama3.2:3b")
        stack.gate.want_reconcile("ollama")
        assert (await measured).bytes == 3200 * MiB
        await stack.gate.store.flush()

    async with running_stack(
        tmp_path, sim_host, fakenvml_path, models_yaml=NO_LLAMA_ENVELOPE, database=True
    ) as stack:
        granted = stack.next_event(EventKind.LEASE_GRANTED, model="llama3.2:3b")
        await ollama.AsyncClient(host=stack.gate_url).generate(
            model="llama3.2:3b", prompt="x", options={"num_predict": 1}
        )
        assert (await granted).bytes == 3200 * MiB
