"""What a request meets when whisper-server is not up: a start the gate has under way is
waited for; a process the gate keeps stopped has its health route answered by the gate,
as the runtime answers it once up, and any other request starts it; a stop on purpose is
never a RUNTIME_CRASH. And `gpugate: ready` means the always_warm whisper is up, or says
why it is not.

The simulated whisper-server binds its port only once its model is loaded, as whisper.cpp's
does (`main` loads before `bind_to_port`): before that a connection is refused.
"""

from __future__ import annotations

import asyncio
import json
import sys

import aiohttp
import pytest

from gpugate.core.effects import EventKind
from gpugate.core.failures import FailureClass
from gpugate.core.lifecycle import LifeState
from gpugate.core.residents import ResidentKey
from gpugate.gate.exchange import FAILURE_HEADER
from gpugate.gate.process_absent import PROCESS_HEADER
from gpugate_sim.whisper import WhisperServerSpec, whisper_argv
from tests.gate.harness import running_stack
from tests.gate.test_process_start import (
    BASE,
    KEEP_WARM,
    SMALL,
    TURBO,
    WHISPER,
    transcribe,
    whisper_yaml,
)
from tests.ports import free_ports

KEY = ResidentKey("whisper", TURBO)
POLLS = 100


@pytest.fixture
def ports():
    return free_ports(2)


def stack_with(tmp_path, sim_host, fakenvml_path, ports, *, load_seconds=0.2, residency=KEEP_WARM):
    listen, upstream = ports
    spec = WhisperServerSpec(
        listen=f"127.0.0.1:{upstream}",
        model=TURBO,
        models={TURBO: WHISPER, BASE: SMALL},
        load_seconds=load_seconds,
        keepalive_timeout=5.0,
    )
    argv = whisper_argv(spec, sim_host.directory)
    extra = whisper_yaml(listen, upstream, argv, residency=residency, cls="background")
    return running_stack(tmp_path, sim_host, fakenvml_path, extra=extra)


def failing_stack(tmp_path, sim_host, fakenvml_path, ports, *, residency=KEEP_WARM):
    """A whisper whose every start fails (its command exits 1 at once)."""
    listen, upstream = ports
    argv = [sys.executable, "-c", "import sys; sys.exit(1)"]
    extra = whisper_yaml(listen, upstream, argv, residency=residency, cls="background")
    return running_stack(tmp_path, sim_host, fakenvml_path, extra=extra)


def failures_of(gate, cls: FailureClass) -> list:
    seen: list = []
    gate.events.subscribe(
        lambda e: (
            e.kind is EventKind.FAILURE
            and e.failure is not None
            and e.failure.failure_class is cls
            and seen.append(e)
        )
    )
    return seen


async def poll_health(session: aiohttp.ClientSession, url: str, times: int = POLLS) -> set:
    """GET /health `times` times: the distinct (status, body, X-GPUGate-Process) seen."""
    seen = set()
    for _ in range(times):
        async with session.get(url + "/health") as resp:
            seen.add((resp.status, await resp.text(), resp.headers.get(PROCESS_HEADER)))
    return seen


async def crash_metric(stack) -> list[str]:
    """The RUNTIME_CRASH lines of the gate's /metrics for whisper."""
    async with (
        aiohttp.ClientSession() as session,
        session.get(stack.control_url + "/metrics") as resp,
    ):
        text = await resp.text()
    return [
        line
        for line in text.splitlines()
        if line.startswith("gpugate_failures")
        and 'consumer="whisper"' in line
        and "RUNTIME_CRASH" in line
    ]


async def test_polling_a_stopped_whispers_health_is_answered_by_the_gate_and_is_no_crash(
    tmp_path, sim_host, fakenvml_path, ports
):
    async with stack_with(tmp_path, sim_host, fakenvml_path, ports) as stack:
        gate = stack.gate
        url = f"http://127.0.0.1:{ports[0]}"
        crashes = failures_of(gate, FailureClass.RUNTIME_CRASH)
        granted = []
        gate.events.subscribe(
            lambda e: e.kind is EventKind.LEASE_GRANTED and granted.append(e), routine=True
        )
        process = gate.links["whisper"].runtime.lifecycle.control
        assert process is not None
        async with aiohttp.ClientSession() as session:
            # keep_warm: not started with the gate. Its health is the runtime's own "ok",
            # given by the gate: a request that needs it starts it.
            stopped = (200, '{"status":"ok"}', "stopped")
            assert await poll_health(session, url) == {stopped}
            async with session.head(url + "/health") as resp:
                assert resp.status == 200 and resp.headers[PROCESS_HEADER] == "stopped"
            assert granted == [] and not await process.is_running()

            assert (await transcribe(url))[0] == 200
            async with session.get(url + "/health") as resp:
                assert resp.status == 200 and await resp.text() == '{"status":"ok"}'
                assert PROCESS_HEADER not in resp.headers, "the runtime's own answer"
                assert resp.headers["Server"] == "whisper.cpp"

            # Stopped on purpose (an eviction, as its ttl would): a state, not a crash.
            done = stack.next_event(EventKind.EVICTION_DONE, key=KEY)
            gate.evict(KEY, force=True)
            assert (await done).detail.split(";")[0] == "reclaimed"
            assert gate.core.lifecycle("whisper").state is LifeState.STOPPED
            assert await poll_health(session, url) == {stopped}
            assert not await process.is_running()
        assert crashes == []
        assert await crash_metric(stack) == []
        assert gate.core.leases() == [] and gate.core.waiting() == []


async def test_a_request_only_the_runtime_can_answer_starts_a_stopped_whisper(
    tmp_path, sim_host, fakenvml_path, ports
):
    async with stack_with(tmp_path, sim_host, fakenvml_path, ports) as stack:
        gate = stack.gate
        url = f"http://127.0.0.1:{ports[0]}"
        crashes = failures_of(gate, FailureClass.RUNTIME_CRASH)
        started = stack.next_event(EventKind.LEASE_GRANTED, key=KEY)
        async with aiohttp.ClientSession() as session:
            # Its page: only whisper-server has it, so the gate starts it.
            async with session.get(url + "/") as resp:
                assert resp.status == 200
                assert resp.headers["Content-Type"].startswith("text/html")
                await resp.read()
            assert (await started).bytes == WHISPER
            assert gate.core.lifecycle("whisper").state is LifeState.UP
            resident = gate.core.resident(KEY)
            assert resident is not None
            used = resident.last_used

            # While it runs, reads pass as they are: they neither lease nor keep it warm.
            granted = []
            gate.events.subscribe(
                lambda e: e.kind is EventKind.LEASE_GRANTED and granted.append(e), routine=True
            )
            for path in ("/health", "/"):
                async with session.get(url + path) as resp:
                    await resp.read()
                    assert resp.status == 200
            assert granted == [] and resident.last_used == used
            assert json.loads((await transcribe(url))[1])["text"] is not None
            assert resident.last_used > used
        assert crashes == []
        assert gate.core.leases() == [] and gate.core.waiting() == []


async def test_requests_that_arrive_while_the_gate_starts_whisper_wait_for_it(
    tmp_path, sim_host, fakenvml_path, ports
):
    # Its model takes 3 s to load, and it binds only after: a request sent once the start
    # began meets a refused connection unless it waits.
    async with stack_with(tmp_path, sim_host, fakenvml_path, ports, load_seconds=3.0) as stack:
        gate = stack.gate
        url = f"http://127.0.0.1:{ports[0]}"
        failures = []
        gate.events.subscribe(lambda e: e.kind is EventKind.FAILURE and failures.append(e))
        starting = stack.next_event(EventKind.LIFECYCLE, detail="stopped → starting")
        starts = []
        gate.events.subscribe(
            lambda e: (
                e.kind is EventKind.LIFECYCLE
                and "→ starting" in (e.detail or "")
                and starts.append(e)
            )
        )
        work = asyncio.create_task(transcribe(url))
        await starting
        assert gate.core.lifecycle("whisper").state is LifeState.STARTING
        async with aiohttp.ClientSession() as session:

            async def get(path: str) -> tuple[int, str | None, str | None]:
                async with session.get(url + path) as resp:
                    await resp.read()
                    return resp.status, resp.headers.get("Server"), resp.headers.get(PROCESS_HEADER)

            health, page = await asyncio.gather(get("/health"), get("/"))
        # Both answered by the runtime once it was up, not by a refused connection.
        assert health == (200, "whisper.cpp", None)
        assert page == (200, "whisper.cpp", None)
        assert (await work)[0] == 200
        assert failures == [] and len(starts) == 1
        assert gate.core.leases() == [] and gate.core.waiting() == []


async def test_a_whisper_that_fails_to_start_says_so_on_its_health_route_once(
    tmp_path, sim_host, fakenvml_path, ports
):
    async with failing_stack(tmp_path, sim_host, fakenvml_path, ports) as stack:
        gate = stack.gate
        url = f"http://127.0.0.1:{ports[0]}"
        crashes = failures_of(gate, FailureClass.RUNTIME_CRASH)
        async with aiohttp.ClientSession() as session:
            form = aiohttp.FormData()
            form.add_field("file", b"RIFF", filename="a.wav")
            async with session.post(url + "/inference", data=form) as resp:
                assert resp.status == 502 and resp.headers[FAILURE_HEADER] == "RUNTIME_CRASH"
            for _ in range(10):
                async with session.get(url + "/health") as resp:
                    body = await resp.text()
                    assert resp.status == 503, body
                    assert resp.headers[FAILURE_HEADER] == "START_BACKOFF"
                    assert "failed to start or ended 1 time(s) in a row" in body
                    assert PROCESS_HEADER not in resp.headers
        assert len(crashes) == 1, [e.detail for e in crashes]
        assert gate.core.leases() == [] and gate.core.waiting() == []


async def test_ready_means_the_always_warm_whisper_is_up(tmp_path, sim_host, fakenvml_path, ports):
    warm = "{policy: always_warm}"
    async with stack_with(tmp_path, sim_host, fakenvml_path, ports, residency=warm) as stack:
        assert stack.lines[-1] == "gpugate: ready"
        assert stack.gate.core.lifecycle("whisper").state is LifeState.UP
        assert stack.gate.core.resident(KEY) is not None


async def test_ready_says_which_always_warm_runtime_is_not_up_and_why(
    tmp_path, sim_host, fakenvml_path, ports
):
    warm = "{policy: always_warm}"
    async with failing_stack(tmp_path, sim_host, fakenvml_path, ports, residency=warm) as stack:
        last = stack.lines[-1]
        assert last.startswith("gpugate: ready (whisper not up: its start failed: "), last
        assert "exit status 1" in last
        assert stack.gate.core.lifecycle("whisper").state is not LifeState.UP
