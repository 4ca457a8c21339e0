"""A single-model llama-server (the real build) as a process consumer: the gate starts it
when a request needs it, under a start lease, forwards once /health answers, and evicts it
by stopping it; a request that does not run the model never starts it."""

from __future__ import annotations

import asyncio
import json
import os
import signal
from pathlib import Path

import httpx
import openai
import pytest

from gpugate.core.effects import EventKind
from gpugate.core.residents import ResidentKey
from tests.llamaserver.gguf_models import write_tiny_llama
from tests.llamaserver.test_through_gate import gate_before
from tests.ports import free_ports

CONFIG_EXTRA = """\
  single:
    runtime: llama-server
    listen: 127.0.0.1:{listen}
    upstream: http://127.0.0.1:{upstream}
    class: interactive
    residency: {{policy: keep_warm, ttl: 10m}}
    envelope: 512MiB
    processes: {{commands: ["{model}"]}}
    control:
      command: {command}
      start_timeout: 60s
      stop_timeout: 5s
"""


def pids_running(model: Path) -> list[int]:
    """The processes whose command line names the model file."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    if str(model).encode() in f.read():
                        found.append(int(entry))
            except OSError:
                continue
    return found


@pytest.fixture
def model(tmp_path) -> Path:
    return write_tiny_llama(tmp_path / "single.gguf", seed=5)


async def test_a_request_starts_it_under_a_lease_and_an_eviction_stops_it(
    llama_server_binary, model, tmp_path, sim_host, fakenvml_path
):
    listen, upstream, router_port = free_ports(3)
    command = [str(llama_server_binary), "-m", str(model), "--host", "127.0.0.1",
               "--port", str(upstream), "-t", "1", "-c", "512", "-np", "1"]  # fmt: skip
    extra = CONFIG_EXTRA.format(
        listen=listen, upstream=upstream, model=model, command=json.dumps(command)
    )
    # gate_before fronts a router consumer too; it points at a port nothing serves.
    async with gate_before(
        f"http://127.0.0.1:{router_port}", tmp_path, fakenvml_path, extra=extra
    ) as gated:
        url = f"http://127.0.0.1:{listen}"
        key = ResidentKey("single", str(model))
        async with httpx.AsyncClient(base_url=url, timeout=60) as client:
            # /health does not start it: the gate answers for the stopped process as
            # llama-server does once up (a request that needs it starts it).
            health = await client.get("/health")
            assert health.status_code == 200
            assert health.json() == {"status": "ok"}
            assert health.headers["Content-Type"] == "application/json; charset=utf-8"
            assert health.headers["X-GPUGate-Process"] == "stopped"
            assert health.headers["Access-Control-Allow-Origin"] == ""
            assert pids_running(model) == []
        granted = gated.gate.events.next(
            lambda e: e.kind is EventKind.LEASE_GRANTED and e.key == key
        )
        client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="x", max_retries=0)
        chat = await client.chat.completions.create(
            model="any", messages=[{"role": "user", "content": "hi"}], max_tokens=3
        )
        assert chat.choices[0].finish_reason == "length"
        assert chat.usage is not None and chat.usage.completion_tokens == 3
        lease = await asyncio.wait_for(granted, 5)
        assert lease.bytes == 512 * 1024 * 1024
        (pid,) = pids_running(model)
        resident = gated.gate.core.resident(key)
        assert resident is not None and resident.process
        done = gated.gate.events.next(lambda e: e.kind is EventKind.EVICTION_DONE and e.key == key)
        gated.gate.evict(key, who="test")
        await asyncio.wait_for(done, 30)
        assert pids_running(model) == []
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
        assert gated.gate.core.resident(key) is None and gated.gate.core.leases() == []
        # The next request starts it again.
        again = await client.completions.create(model="any", prompt="ab", max_tokens=2)
        assert again.choices[0].text
        assert len(pids_running(model)) == 1
    # The gate stopped its child when it stopped.
    left = pids_running(model)
    for stale in left:
        os.kill(stale, signal.SIGKILL)
    assert left == []
