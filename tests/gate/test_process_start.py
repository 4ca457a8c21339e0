"""A process runtime behind the gate: started on demand, evicted by a stop, started again.

The simulated whisper-server runs as the gate's supervised child (its `control.command`);
the gate sees it through the fake NVML library and /proc like any process.
"""

from __future__ import annotations

import asyncio
import json
import textwrap

import aiohttp
import pytest

from gpugate.core.effects import EventKind
from gpugate.core.residents import ResidentKey, ResidentState
from gpugate.core.units import MiB
from gpugate.runtimes.process_supervised import SupervisedCommand
from gpugate_sim.serverprocess import child_env
from gpugate_sim.whisper import WhisperServerSpec, whisper_argv
from tests.gate.harness import running_stack
from tests.ports import free_ports

TURBO = "models/ggml-large-v3-turbo.bin"
BASE = "models/ggml-base.en.bin"
WHISPER = 2050 * MiB
SMALL = 200 * MiB


def wav_bytes(seconds: float = 1.0) -> bytes:
    """A silent 16 kHz mono WAV."""
    import io
    import wave

    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(16000)
        w.writeframes(b"\0\0" * int(16000 * seconds))
    return out.getvalue()


def whisper_yaml(
    port: int, upstream: int, argv: list[str], *, residency: str, cls: str, admission: str = "10s"
) -> str:
    command = json.dumps(argv)
    return textwrap.indent(
        textwrap.dedent(f"""\
          whisper:
            runtime: whisper
            listen: 127.0.0.1:{port}
            upstream: http://127.0.0.1:{upstream}
            class: {cls}
            envelope: 2050MiB
            residency: {residency}
            processes: {{commands: ["whisper-server"]}}
            models:
              {BASE}: {{envelope: 200MiB}}
            control:
              command: {command}
              env: {{PYTHONPATH: {json.dumps(child_env({})["PYTHONPATH"])}}}
              start_timeout: 20s
              stop_timeout: 5s
              start_admission_timeout: {admission}
        """),
        "  ",
    )


@pytest.fixture
def ports():
    return free_ports(2)


KEEP_WARM = "{policy: keep_warm, ttl: 10m}"


def stack_for(tmp_path, sim_host, fakenvml_path, ports, *, residency=KEEP_WARM, cls="background"):
    listen, upstream = ports
    spec = WhisperServerSpec(
        listen=f"127.0.0.1:{upstream}",
        model=TURBO,
        models={TURBO: WHISPER, BASE: SMALL},
        load_seconds=0.2,
        keepalive_timeout=5.0,
    )
    argv = whisper_argv(spec, sim_host.directory)
    extra = whisper_yaml(listen, upstream, argv, residency=residency, cls=cls)
    return running_stack(tmp_path, sim_host, fakenvml_path, extra=extra)


async def transcribe(url: str) -> tuple[int, str]:
    form = aiohttp.FormData()
    form.add_field("file", wav_bytes(), filename="a.wav", content_type="audio/wav")
    form.add_field("response_format", "json")
    async with aiohttp.ClientSession() as session, session.post(url + "/inference", data=form) as r:
        return r.status, await r.text()


async def until(predicate, timeout: float = 10.0) -> None:
    """Poll a condition of the gate's books (the always_warm start runs on its own)."""
    async with asyncio.timeout(timeout):
        while not predicate():
            await asyncio.sleep(0.05)


def whisper_pids(stack) -> list[int]:
    return [p.pid for p in stack.host.read().processes if p.used == WHISPER]


async def test_a_request_starts_a_stopped_whisper_under_a_lease_and_is_answered(
    tmp_path, sim_host, fakenvml_path, ports
):
    async with stack_for(tmp_path, sim_host, fakenvml_path, ports) as stack:
        gate = stack.gate
        url = f"http://127.0.0.1:{ports[0]}"
        assert gate.core.residents() == [] or all(
            r.key.consumer != "whisper" for r in gate.core.residents()
        ), "keep_warm: not started with the gate"
        granted = stack.next_event(EventKind.LEASE_GRANTED, key=ResidentKey("whisper", TURBO))
        appeared = stack.next_event(EventKind.LEASE_RELEASED, reason="resident")
        status, text = await transcribe(url)
        assert status == 200, text
        assert "text" in json.loads(text)
        lease_event = await granted
        assert lease_event.bytes == WHISPER
        # The start lease became the resident once NVML showed the process: only then
        # was the request forwarded (it waited on the loading resident).
        assert appeared.done()
        resident = gate.core.resident(ResidentKey("whisper", TURBO))
        assert resident is not None and resident.state is ResidentState.RESIDENT
        # It shows its memory as it allocates it; the whole of it is counted once.
        assert resident.bytes >= 0.75 * WHISPER
        await until(lambda: gate.core.budget(0).consumer("whisper").committed == WHISPER)
        assert gate.core.leases() == [] and gate.core.waiting() == []
        assert stack.host.ooms() == []


async def test_eviction_stops_the_process_and_the_next_request_starts_it_again(
    tmp_path, sim_host, fakenvml_path, ports
):
    async with stack_for(tmp_path, sim_host, fakenvml_path, ports) as stack:
        gate = stack.gate
        url = f"http://127.0.0.1:{ports[0]}"
        assert (await transcribe(url))[0] == 200
        process = gate.links["whisper"].runtime.lifecycle.control
        assert isinstance(process, SupervisedCommand) and process.running
        first_pid = process.pid

        # gemma3:12b and qwen2.5:7b (interactive) do not both fit beside whisper
        # (background): the idle whisper is stopped for the second.
        done = stack.next_event(EventKind.EVICTION_DONE, key=ResidentKey("whisper", TURBO))
        async with aiohttp.ClientSession() as session:
            for model in ("gemma3:12b", "qwen2.5:7b"):
                body = {"model": model, "prompt": "hi", "stream": False}
                async with session.post(stack.gate_url + "/api/generate", json=body) as resp:
                    assert resp.status == 200, await resp.text()
            evicted = await done
            # qwen2.5:7b unloaded (Ollama's unload shortcut) leaves room for whisper again.
            body = {"model": "qwen2.5:7b", "prompt": "", "keep_alive": 0}
            async with session.post(stack.gate_url + "/api/generate", json=body) as resp:
                assert resp.status == 200, await resp.text()
        assert evicted.detail.split(";")[0] == "reclaimed"
        assert not process.running and process.last_exit is not None
        assert process.last_exit.stopped
        assert whisper_pids(stack) == []

        status, text = await transcribe(url)
        assert status == 200, text
        assert process.running and process.pid != first_pid
        assert stack.host.ooms() == []


async def test_always_warm_is_started_with_the_gate(tmp_path, sim_host, fakenvml_path, ports):
    warm = "{policy: always_warm}"
    async with stack_for(tmp_path, sim_host, fakenvml_path, ports, residency=warm) as stack:
        await until(lambda: stack.gate.core.leases() == [])
        resident = stack.gate.core.resident(ResidentKey("whisper", TURBO))
        assert resident is not None and resident.bytes >= 0.75 * WHISPER


async def test_load_is_a_demand_for_the_new_models_envelope(
    tmp_path, sim_host, fakenvml_path, ports
):
    async with stack_for(tmp_path, sim_host, fakenvml_path, ports) as stack:
        gate = stack.gate
        url = f"http://127.0.0.1:{ports[0]}"
        assert (await transcribe(url))[0] == 200
        granted = stack.next_event(EventKind.LEASE_GRANTED, key=ResidentKey("whisper", BASE))
        # Ended by whisper-server's answer, as a request's lease is.
        switched = stack.next_event(
            EventKind.LEASE_RELEASED, key=ResidentKey("whisper", BASE), reason="done"
        )
        form = aiohttp.FormData()
        form.add_field("model", BASE, content_type="text/plain")  # multipart, as curl -F
        async with aiohttp.ClientSession() as session, session.post(url + "/load", data=form) as r:
            assert r.status == 200, await r.text()
        assert (await granted).bytes == SMALL
        await switched
        await until(lambda: stack.gate.core.resident(ResidentKey("whisper", TURBO)) is None)
        assert gate.links["whisper"].runtime.lifecycle.process_model() == BASE
        new = gate.core.resident(ResidentKey("whisper", BASE))
        assert new is not None and new.bytes >= 0.75 * SMALL
        assert gate.core.resident(ResidentKey("whisper", TURBO)) is None
        assert (await transcribe(url))[0] == 200
        assert gate.core.leases() == []
