"""A single-model llama-server the gate starts (the real build) is told its lease: `-c`, the
largest context whose load fits in it, when its command sets none; a command that sets one
keeps its own."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import attrs
import httpx
import pytest

from gpugate.core.effects import EventKind
from gpugate.core.residents import ResidentKey
from gpugate.runtimes.gguf import read_file
from gpugate.runtimes.llamacpp import header_shape, load_size
from gpugate.runtimes.llamaserver.memory import Launch
from tests.llamaserver.gguf_models import write_tiny_llama
from tests.llamaserver.test_single_through_gate import CONFIG_EXTRA, pids_running
from tests.llamaserver.test_through_gate import gate_before
from tests.ports import free_ports


def cmdline(pid: int) -> list[str]:
    return [w.decode() for w in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[:-1]]


@pytest.mark.parametrize("own_context", [None, "2048"])
async def test_a_started_llama_server_is_told_the_context_its_lease_holds(
    llama_server_binary, tmp_path, sim_host, fakenvml_path, own_context
):
    model = write_tiny_llama(tmp_path / "long.gguf", context_length=32768, seed=7)
    listen, upstream, router_port = free_ports(3)
    command = [str(llama_server_binary), "-m", str(model), "--host", "127.0.0.1",
               "--port", str(upstream), "-t", "1", "-np", "1"]  # fmt: skip
    if own_context is not None:
        command += ["-c", own_context]
    # The envelope is what its load takes at 8192 tokens of its 32768.
    shape = header_shape(read_file(model))
    assert shape is not None
    options = Launch.read(lambda *names: None).options
    options = attrs.evolve(options, n_parallel=1, unified=False, n_ctx=8192)
    envelope = load_size(shape, options).total
    extra = CONFIG_EXTRA.format(
        listen=listen, upstream=upstream, model=model, command=json.dumps(command)
    ).replace("envelope: 512MiB", f'envelope: "{envelope}"')
    async with gate_before(
        f"http://127.0.0.1:{router_port}", tmp_path, fakenvml_path, extra=extra
    ) as gated:
        key = ResidentKey("single", str(model))
        granted = gated.gate.events.next(
            lambda e: e.kind is EventKind.LEASE_GRANTED and e.key == key
        )
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{listen}", timeout=60) as client:
            answer = await client.post("/completion", json={"prompt": "ab", "n_predict": 2})
            assert answer.status_code == 200, answer.text
            assert (await asyncio.wait_for(granted, 5)).bytes == envelope
            (pid,) = pids_running(model)
            told = cmdline(pid)
            # The server itself runs with the context it was told (or its own).
            props = (await client.get("/props")).json()
        context = own_context or "8192"
        assert told == command + ([] if own_context else ["-c", "8192"])
        assert props["default_generation_settings"]["n_ctx"] == int(context)
    left = pids_running(model)
    for stale in left:
        os.kill(stale, 9)
    assert left == []
