"""A switch of whisper-server's model (`POST /load`) behind the gate: leased for the new
model's envelope, and ended by whisper-server's answer, whatever NVML shows.

whisper-server answers /load once the new model is loaded (whisper.cpp v1.8.5
examples/server/server.cpp, the `/load` handler: `whisper_free`, then
`whisper_init_from_file_with_params`, then the 200). A smaller model (or the same one)
never shows its envelope in NVML: a lease that waited for it held the next transcription
until its `start_admission_timeout`. A /load it refuses (400: no `model` field, or the file
is not there) is refused before it frees anything: the old model stays.
"""

from __future__ import annotations

import asyncio

import aiohttp
import pytest

from gpugate.core.effects import EventKind
from gpugate.core.residents import ResidentKey, ResidentState
from gpugate.gate.exchange import LEASE_HEADER
from gpugate_sim.whisper import WhisperServerSpec, whisper_argv
from tests.gate.harness import running_stack
from tests.gate.test_process_start import (
    BASE,
    KEEP_WARM,
    SMALL,
    TURBO,
    WHISPER,
    transcribe,
    until,
    whisper_yaml,
)
from tests.ports import free_ports

SAME_SIZE = "models/ggml-large-v3.bin"
"""A model as large as turbo (the simulated one: 2,050 MiB)."""
ANSWERED = 60.0
"""How long the test waits for the next transcription: far below the 10 min a lease
waiting for NVML would hold it."""


@pytest.fixture
def ports():
    return free_ports(2)


def switch_stack(tmp_path, sim_host, fakenvml_path, ports):
    """whisper runs turbo (2,050 MiB) and can load base.en (200 MiB) or large-v3 (2,050
    MiB). No model has an envelope of its own: a switch is leased the consumer's 2,050 MiB.
    A lease that waited for NVML to show more would wait 10 minutes
    (`start_admission_timeout`)."""
    listen, upstream = ports
    spec = WhisperServerSpec(
        listen=f"127.0.0.1:{upstream}",
        model=TURBO,
        models={TURBO: WHISPER, BASE: SMALL, SAME_SIZE: WHISPER},
        load_seconds=0.2,
        keepalive_timeout=5.0,
    )
    argv = whisper_argv(spec, sim_host.directory)
    extra = (
        whisper_yaml(listen, upstream, argv, residency=KEEP_WARM, cls="background")
        .replace(f"{BASE}: {{envelope: 200MiB}}", f"{TURBO}: {{reload_seconds: 1s}}")
        .replace("start_admission_timeout: 10s", "start_admission_timeout: 10m")
    )
    assert "10m" in extra and "200MiB" not in extra
    return running_stack(tmp_path, sim_host, fakenvml_path, extra=extra)


async def load(url: str, model: str) -> tuple[int, str, int | None]:
    """POST /load: its status, body and the gate's lease for it."""
    form = aiohttp.FormData()
    form.add_field("model", model, content_type="text/plain")
    async with aiohttp.ClientSession() as session, session.post(url + "/load", data=form) as r:
        lease = r.headers.get(LEASE_HEADER)
        return r.status, await r.text(), None if lease is None else int(lease)


def record(gate) -> list:
    """Every event from now on, the routine ones (grants, releases) included."""
    seen: list = []
    gate.events.subscribe(seen.append, routine=True)
    return seen


@pytest.mark.parametrize(
    ("model", "holds"), [(BASE, SMALL), (SAME_SIZE, WHISPER)], ids=["smaller", "same-size"]
)
async def test_a_switch_ends_its_lease_on_the_answer_whatever_nvml_shows(
    tmp_path, sim_host, fakenvml_path, ports, model, holds
):
    async with switch_stack(tmp_path, sim_host, fakenvml_path, ports) as stack:
        gate = stack.gate
        url = f"http://127.0.0.1:{ports[0]}"
        assert (await transcribe(url))[0] == 200
        pid = gate.links["whisper"].runtime.lifecycle.control.pid
        events = record(gate)
        key = ResidentKey("whisper", model)
        ended = stack.next_event(EventKind.LEASE_RELEASED, key=key)

        status, body, lease_id = await load(url, model)
        assert (status, body) == (200, "Load was successful!")
        assert lease_id is not None
        (granted,) = [
            e for e in events if e.kind is EventKind.LEASE_GRANTED and e.lease == lease_id
        ]
        assert granted.bytes == WHISPER, "leased the consumer's envelope"
        # It ends as its request does (a lease that waited for NVML would end in 10 min).
        async with asyncio.timeout(ANSWERED):
            released = await ended
        assert (released.lease, released.reason) == (lease_id, "done")
        assert gate.core.lease(lease_id) is None
        resident = gate.core.resident(key)
        assert resident is not None and resident.state is ResidentState.RESIDENT
        assert resident.process and resident.tracks_observed

        # The next transcription is served by the new model at once: no lease waits.
        async with asyncio.timeout(ANSWERED):
            status, text = await transcribe(url)
        assert status == 200, text
        assert gate.links["whisper"].runtime.lifecycle.control.pid == pid, (
            "no start: the same process"
        )
        # The next samples correct the books to what NVML shows.
        await until(lambda: gate.core.resident(key).bytes == holds)
        await until(lambda: gate.core.budget(0).consumer("whisper").committed == holds)
        failures = [e for e in events if e.kind is EventKind.FAILURE]
        assert failures == [], [e.detail for e in failures]
        assert gate.core.leases() == [] and gate.core.waiting() == []
        assert stack.host.ooms() == []


async def test_a_load_whisper_refuses_leaves_the_old_model_resident(
    tmp_path, sim_host, fakenvml_path, ports
):
    async with switch_stack(tmp_path, sim_host, fakenvml_path, ports) as stack:
        gate = stack.gate
        url = f"http://127.0.0.1:{ports[0]}"
        assert (await transcribe(url))[0] == 200
        pid = gate.links["whisper"].runtime.lifecycle.control.pid
        events = record(gate)
        missing = ResidentKey("whisper", "models/not-there.bin")
        ended = stack.next_event(EventKind.LEASE_RELEASED, key=missing)

        status, body, lease_id = await load(url, missing.model)
        assert status == 400, body
        assert lease_id is not None, "leased before it was forwarded"
        async with asyncio.timeout(ANSWERED):
            released = await ended
        assert (released.lease, released.reason) == (lease_id, "failed")
        assert gate.core.resident(missing) is None
        old = gate.core.resident(ResidentKey("whisper", TURBO))
        assert old is not None and old.state is ResidentState.RESIDENT and old.process
        assert old.idle, "busy with no request"
        await until(lambda: old.bytes == WHISPER)  # as NVML shows it

        # It still runs the old model: the next transcription is served by it, no start.
        events.clear()
        async with asyncio.timeout(ANSWERED):
            status, text = await transcribe(url)
        assert status == 200, text
        grants = [e for e in events if e.kind is EventKind.LEASE_GRANTED]
        assert [(e.key, e.bytes) for e in grants] == [(ResidentKey("whisper", TURBO), 0)]
        assert gate.links["whisper"].runtime.lifecycle.control.pid == pid
        assert [e for e in events if e.kind is EventKind.FAILURE] == []
        assert gate.core.leases() == [] and gate.core.waiting() == []
