"""The real whisper-server's life behind the gate: its health route while the gate keeps it
stopped (answered by the gate as whisper-server answers it, headers and all) and while the
gate starts it (the request waits for the server's own answer); an exit (SIGKILL, or a
/load of a file that is no model, on which server.cpp exits 1) and the next transcription
(it is started again once the 1 s backoff of that exit ends); and the gate killed with
SIGKILL and started again (the whisper-server it left running is adopted: one process,
loaded once). tests/whisper/gated.py says how the CPU build shows on the simulated card.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import AsyncIterator

import attrs
import pytest

from gpugate.core.effects import EventKind
from gpugate.core.failures import FailureClass
from gpugate.core.lifecycle import LifeState
from gpugate.gate.process_absent import PROCESS_HEADER
from tests.clihost import GateProcess
from tests.whisper.conftest import Models
from tests.whisper.fifo import feed, make_fifo
from tests.whisper.gated import (
    START,
    Gated,
    GpuShadow,
    gate_before,
    loads_in,
    server_pid,
    server_pids,
    setup_for,
)
from tests.whisper.test_through_gate import raw_exchange, transcribe
from tests.whisper.wire import Answer, exchange, form_type, model_form, request

FRAMING = {"connection", "keep-alive", "date", PROCESS_HEADER.lower()}
"""What may differ between whisper-server's answer and the gate's in its place: framing,
the Date the gate adds, and the gate's mark."""


@pytest.fixture
async def gated(
    whisper_server_binary, models: Models, tmp_path, sim_host, fakenvml_path
) -> AsyncIterator[Gated]:
    async with gate_before(
        whisper_server_binary, models, tmp_path, sim_host, fakenvml_path
    ) as gated:
        yield gated


async def ask(port: int, method: str) -> Answer:
    raw = request(method, "/health", headers=[b"Connection: close"])
    return await asyncio.to_thread(exchange, port, raw, method == "HEAD")


def comparable(answer: Answer) -> tuple[int, list[tuple[str, str]], bytes]:
    headers = sorted((k.lower(), v) for k, v in answer.headers if k.lower() not in FRAMING)
    return answer.status, headers, answer.body


async def until(predicate, seconds: float = START) -> None:  # type: ignore[no-untyped-def]
    """Poll what the server's log, /proc or the gate's books say, up to `seconds`."""
    async with asyncio.timeout(seconds):
        while not predicate():
            await asyncio.sleep(0.02)


@pytest.mark.parametrize("method", ["GET", "HEAD"])
async def test_health_while_stopped_is_answered_as_whisper_server_answers_it(gated, models, method):
    stood = await ask(gated.port, method)
    assert stood.header(PROCESS_HEADER) == "stopped"
    assert gated.loads() == [] and gated.granted() == [], "nothing started or leased"
    assert (await transcribe(gated.url))[0] == 200
    own = await ask(gated.upstream, method)
    assert (own.status, own.header(PROCESS_HEADER)) == (200, None)
    # Status, headers (CORS, Server, Content-Type, Content-Length; Accept-Ranges to a
    # HEAD) and body byte for byte, but for framing and Date.
    assert comparable(stood) == comparable(own)
    assert comparable(await ask(gated.port, method)) == comparable(own), "relayed once up"


async def test_health_while_the_gate_starts_it_waits_for_its_own_answer(
    whisper_server_binary, models, tmp_path, sim_host, fakenvml_path, monkeypatch
):
    # Its model a named pipe: whisper-server loads it before it binds its port, and the
    # load waits for the pipe's writer, so the start is held where the test looks at it.
    pipe = make_fifo(tmp_path / "slow.bin")
    slow = attrs.evolve(models, english=pipe)
    async with gate_before(whisper_server_binary, slow, tmp_path, sim_host, fakenvml_path) as gated:
        starts = gated.gate.processes.under_way
        held = asyncio.Event()
        wait = starts.wait

        async def spied(consumer: str, timeout: float) -> bool:
            held.set()
            return await wait(consumer, timeout)

        monkeypatch.setattr(starts, "wait", spied)
        work = asyncio.create_task(transcribe(gated.url))
        await until(lambda: gated.loads() == [str(pipe)])
        assert gated.gate.core.lifecycle("whisper").state is LifeState.STARTING
        health = asyncio.create_task(ask(gated.port, "GET"))
        await asyncio.wait_for(held.wait(), START)  # the gate holds it for the start
        assert not health.done()
        await asyncio.to_thread(feed, pipe, models.english.read_bytes())
        answer = await health
        # whisper-server's own answer, once it was up: not the gate's stand-in.
        assert (answer.status, answer.body) == (200, b'{"status":"ok"}')
        assert answer.header(PROCESS_HEADER) is None
        assert answer.header("Server") == "whisper.cpp"
        assert (await work)[0] == 200
        assert gated.loads() == [str(pipe)], "started once"
        assert not [e for e in gated.events if e.kind is EventKind.FAILURE]


@pytest.mark.parametrize("how", ["sigkill", "load-not-a-model"])
async def test_after_it_exits_the_next_transcription_starts_it_again(gated, models, how):
    assert (await transcribe(gated.url))[0] == 200
    first = server_pid(gated.upstream)
    assert first is not None
    ended = gated.gate.events.next(
        lambda e: e.kind is EventKind.LIFECYCLE and "its process ended" in (e.detail or "")
    )
    if how == "sigkill":
        os.kill(first, signal.SIGKILL)
    else:
        # It opens, is no model: server.cpp frees the old model, fails, exits 1 unanswered.
        raw = request(
            "POST", "/load", model_form(str(models.not_a_model)), content_type=form_type()
        )
        status, headers, said = await raw_exchange(gated.port, raw)
        # Its load failed, and its end was that load's: no crash, no backoff.
        assert (status, headers.get("X-GPUGate-Failure")) == (502, "MODEL_LOAD_FAILED"), said
    event = await asyncio.wait_for(ended, START)
    if how == "sigkill":
        assert event.detail == "up → stopped: its process ended: killed by SIGKILL (status 137)"
    else:
        assert event.detail == "up → stopped: its process ended switching its model: exit status 1"
    # Started again for the next transcription: after the crash's 1 s backoff, or at once.
    status, text = await transcribe(gated.url)
    assert status == 200, text
    second = server_pid(gated.upstream)
    assert second is not None and second != first
    assert server_pids(gated.upstream) == [second], "one process"
    middle = [] if how == "sigkill" else [str(models.not_a_model)]
    assert gated.loads() == [str(models.english), *middle, str(models.english)]
    starts = [
        e
        for e in gated.events
        if e.kind is EventKind.LEASE_GRANTED and e.model == str(models.english) and e.bytes
    ]
    assert len(starts) == 2, "the restart under a lease of its own"
    await until(lambda: gated.gate.core.leases() == [])
    assert gated.gate.core.waiting() == []
    failures = [e.failure.failure_class for e in gated.events if e.kind is EventKind.FAILURE]
    crash, failed_load = FailureClass.RUNTIME_CRASH, FailureClass.MODEL_LOAD_FAILED
    assert failures == ([crash] if how == "sigkill" else [failed_load])


async def test_a_gate_killed_and_started_again_adopts_its_whisper_server(
    whisper_server_binary, models, tmp_path, sim_host, fakenvml_path, subprocess_env
):
    setup = setup_for(whisper_server_binary, models, tmp_path, fakenvml_path)
    config = tmp_path / "consumers.yaml"
    config.write_text(setup.text)
    url = f"http://127.0.0.1:{setup.listen}"
    control = f"http://127.0.0.1:{setup.control}"
    shadow = asyncio.create_task(GpuShadow(sim_host, setup.upstream, setup.log, setup.sizes).run())
    pid = None
    try:
        first = await asyncio.to_thread(GateProcess(config, subprocess_env, url, control).start)
        try:
            assert (await transcribe(url))[0] == 200
            pid = server_pid(setup.upstream)
            assert pid is not None
        finally:
            # No shutdown code runs: the whisper-server it started (in a session of its
            # own) runs on.
            await asyncio.to_thread(first.kill)
        os.kill(pid, 0)
        second = await asyncio.to_thread(GateProcess(config, subprocess_env, url, control).start)
        try:
            status, text = await transcribe(url)
            assert status == 200, text
            assert server_pids(setup.upstream) == [pid], "adopted: one process"
            assert loads_in(setup.log) == [str(models.english)], "loaded once: no second start"
            lines = await asyncio.to_thread(second.stderr_lines)
            assert any("adopted instead of starting another" in line for line in lines), lines
        finally:
            await asyncio.to_thread(second.stop)
    finally:
        shadow.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await shadow
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
