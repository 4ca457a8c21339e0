"""A process runtime's real lifetime behind the gate: found before it is started, ready
when it answers, started again after a crash with a backoff, a /load in the old model's place.

The simulated whisper-server runs as the gate's supervised child, or as a process the
test starts itself (one an earlier gate left behind, or one started by hand).
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys

import aiohttp
import attrs
import pytest

from gpugate.core.effects import EventKind
from gpugate.core.failures import FailureClass
from gpugate.core.residents import ResidentKey, ResidentState
from gpugate.core.units import MiB
from gpugate.gate.exchange import FAILURE_HEADER
from gpugate.runtimes.process_supervised import SupervisedCommand
from gpugate_sim.serverprocess import child_env
from gpugate_sim.whisper import WhisperServerSpec, whisper_argv
from tests.gate.harness import running_stack
from tests.gate.test_process_absent import failures_of
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


@pytest.fixture
def ports():
    return free_ports(2)


def spec_for(upstream: int, size: int = WHISPER) -> WhisperServerSpec:
    return WhisperServerSpec(
        listen=f"127.0.0.1:{upstream}",
        model=TURBO,
        models={TURBO: size, BASE: SMALL},
        load_seconds=0.2,
        keepalive_timeout=5.0,
    )


def stack_with(
    tmp_path, sim_host, fakenvml_path, ports, argv, *, residency=KEEP_WARM, admission="10s"
):
    listen, upstream = ports
    extra = whisper_yaml(
        listen, upstream, argv, residency=residency, cls="background", admission=admission
    )
    return running_stack(tmp_path, sim_host, fakenvml_path, extra=extra)


def process_of(stack) -> SupervisedCommand:
    process = stack.gate.links["whisper"].runtime.lifecycle.control
    assert isinstance(process, SupervisedCommand)
    return process


def pids_holding(stack) -> list[int]:
    """The whisper-servers the simulated card shows."""
    return sorted(p.pid for p in stack.host.read().processes if p.name == "whisper-server")


class Outside:
    """A whisper-server the gate did not start (an earlier gate's child, or by hand)."""

    def __init__(self, argv: list[str]) -> None:
        env = {**os.environ, **child_env({})}
        self.process = subprocess.Popen(argv, env=env, start_new_session=True,
                                        stdout=subprocess.DEVNULL)  # fmt: skip

    @property
    def pid(self) -> int:
        return self.process.pid

    @staticmethod
    async def ready(url: str) -> None:
        async with asyncio.timeout(20), aiohttp.ClientSession() as session:
            while True:
                try:
                    async with session.get(url + "/health") as resp:
                        if resp.status == 200:
                            return
                except aiohttp.ClientError:
                    pass
                await asyncio.sleep(0.05)

    def close(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()


@pytest.mark.parametrize("found_by", ["command", "port"])
async def test_a_running_whisper_is_adopted_never_started_twice(
    tmp_path, sim_host, fakenvml_path, ports, found_by
):
    listen, upstream = ports
    argv = whisper_argv(spec_for(upstream), sim_host.directory)
    # Found by its command line (exactly the gate's command), or only by its port.
    outside_argv = argv if found_by == "command" else [*argv, "--sim-keepalive-max", "100"]
    outside = Outside(outside_argv)
    try:
        await outside.ready(f"http://127.0.0.1:{upstream}")
        async with stack_with(tmp_path, sim_host, fakenvml_path, ports, argv) as stack:
            gate = stack.gate
            url = f"http://127.0.0.1:{listen}"
            status, text = await transcribe(url)
            assert status == 200, text
            process = process_of(stack)
            assert process.adopted and process.pid == outside.pid
            assert pids_holding(stack) == [outside.pid], "one whisper-server, not two"
            resident = gate.core.resident(ResidentKey("whisper", TURBO))
            assert resident is not None and resident.bytes == WHISPER
            await until(lambda: gate.core.budget(0).consumer("whisper").committed == WHISPER)

            # Evicting it stops the adopted process; the next request starts the gate's own.
            done = stack.next_event(EventKind.EVICTION_DONE, key=ResidentKey("whisper", TURBO))
            gate.evict(ResidentKey("whisper", TURBO), force=True)
            assert (await done).detail.split(";")[0] == "reclaimed"
            async with asyncio.timeout(10):
                await asyncio.to_thread(outside.process.wait)
            assert (await transcribe(url))[0] == 200
            assert not process.adopted and process.pid not in (None, outside.pid)
            assert pids_holding(stack) == [process.pid]
            assert stack.host.ooms() == []
    finally:
        outside.close()


async def test_a_start_is_ready_when_the_runtime_answers_whatever_nvml_shows(
    tmp_path, sim_host, fakenvml_path, ports
):
    # A whisper-server that shows nothing in NVML (a CPU build): its start lease would
    # never see 75 % of its envelope. It is ready once its port and /health answer.
    listen, upstream = ports
    argv = whisper_argv(spec_for(upstream, size=0), sim_host.directory)
    async with stack_with(tmp_path, sim_host, fakenvml_path, ports, argv) as stack:
        gate = stack.gate
        url = f"http://127.0.0.1:{listen}"
        ready = stack.next_event(EventKind.LEASE_RELEASED, reason="resident")
        failures = []
        gate.events.subscribe(lambda e: e.kind is EventKind.FAILURE and failures.append(e))
        status, text = await transcribe(url)
        assert status == 200, text
        assert ready.done(), "the start lease ended when the process answered"
        assert gate.core.observation(0).managed.get("whisper", 0) == 0
        resident = gate.core.resident(ResidentKey("whisper", TURBO))
        assert resident is not None and resident.state is ResidentState.RESIDENT
        # Samples showing none of it keep it: it runs, it just holds nothing there.
        sampled = gate.core.budget(0).sampled_at
        await until(lambda: gate.core.budget(0).sampled_at > sampled + 0.3)
        resident = gate.core.resident(ResidentKey("whisper", TURBO))
        assert resident is not None and resident.bytes == 0
        pid = process_of(stack).pid
        assert (await transcribe(url))[0] == 200
        assert process_of(stack).pid == pid, "not started again"
        assert failures == [] and gate.core.leases() == []


async def test_what_a_started_process_holds_is_learned_and_leased_next_time(
    tmp_path, sim_host, fakenvml_path, ports
):
    listen, upstream = ports
    holds = 1400 * MiB
    argv = whisper_argv(spec_for(upstream, size=holds), sim_host.directory)
    async with stack_with(tmp_path, sim_host, fakenvml_path, ports, argv) as stack:
        gate = stack.gate
        url = f"http://127.0.0.1:{listen}"
        first = stack.next_event(EventKind.LEASE_GRANTED, key=ResidentKey("whisper", TURBO))
        assert (await transcribe(url))[0] == 200
        assert (await first).bytes == WHISPER, "its configured envelope, the first time"
        key = ResidentKey("whisper", TURBO)
        await until(lambda: gate.envelopes.measured(key) == holds)
        done = stack.next_event(EventKind.EVICTION_DONE, key=key)
        gate.evict(key, force=True)
        await done
        again = stack.next_event(EventKind.LEASE_GRANTED, key=key)
        assert (await transcribe(url))[0] == 200
        assert (await again).bytes == holds


async def test_a_start_that_fails_is_counted_once_and_backs_off(
    tmp_path, sim_host, fakenvml_path, ports
):
    starts = tmp_path / "starts"
    script = (
        "import sys\n"
        f"open({str(starts)!r}, 'a').write('x')\n"
        "sys.stderr.write('whisper_init_from_file: failed to open SECRET-MODEL-PATH\\n')\n"
        "sys.exit(1)\n"
    )
    # A request may wait 1.25 s for its start: a 1 s backoff is waited out, a 2 s one not.
    async with stack_with(
        tmp_path, sim_host, fakenvml_path, ports, [sys.executable, "-c", script], admission="1.25s"
    ) as stack:
        gate = stack.gate
        url = f"http://127.0.0.1:{ports[0]}"
        crashes = failures_of(gate, FailureClass.RUNTIME_CRASH)
        async with aiohttp.ClientSession() as session:

            async def post() -> tuple[int, str | None, str | None, str]:
                form = aiohttp.FormData()
                form.add_field("file", b"RIFF", filename="a.wav")
                async with session.post(url + "/inference", data=form) as resp:
                    failure, retry = (
                        resp.headers.get(FAILURE_HEADER),
                        resp.headers.get("Retry-After"),
                    )
                    return resp.status, failure, retry, await resp.text()

            status, failure, _, body = await post()
            assert (status, failure) == (502, "RUNTIME_CRASH")
            assert "SECRET-MODEL-PATH" not in body, "the runtime's log stays in the gate's log"
            assert "exit status 1" in body and "next start in 1s at the earliest" in body
            # Its 1 s backoff ends within the request's wait: waited out, then a start.
            status, failure, _, body = await post()
            assert (status, failure) == (502, "RUNTIME_CRASH"), body
            assert starts.read_text() == "xx", "the second request started it again"
            # Its backoff is now 2 s, longer than a request may wait: refused at once.
            status, failure, retry, body = await post()
            assert (status, failure) == (503, "START_BACKOFF"), body
            assert retry is not None and 1 <= int(retry) <= 2
            assert "ended 2 time(s) in a row; the next start is in " in body
            assert "in 0s" not in body
        assert starts.read_text() == "xx", "the third request did not start it"
        assert len(crashes) == 2, [e.detail for e in crashes]
        assert gate.core.leases() == [] and gate.core.waiting() == []


ENDING = """\
import asyncio, signal, sys
from aiohttp import web

port, starts, closed = int(sys.argv[1]), sys.argv[2], sys.argv[3]
open(starts, "a").write("x")


async def main():
    async def health(request):
        return web.json_response({"status": "ok"})

    async def inference(request):
        await request.read()
        return web.json_response({"text": "hello"})

    app = web.Application()
    app.router.add_get("/health", health)
    app.router.add_post("/inference", inference)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", port, reuse_address=True)
    await site.start()
    loop = asyncio.get_running_loop()
    closing, ending = asyncio.Event(), asyncio.Event()
    loop.add_signal_handler(signal.SIGUSR1, closing.set)
    loop.add_signal_handler(signal.SIGUSR2, ending.set)
    await closing.wait()
    await site.stop()
    open(closed, "w").write("closed")
    await ending.wait()
    sys.exit(1)


asyncio.run(main())
"""
"""A runtime that, on SIGUSR1, stops listening but runs on until SIGUSR2 ends it (exit 1):
a process on its way out, which the gate has not seen end yet."""


async def test_a_request_that_meets_its_process_ending_is_served_by_its_next_start(
    tmp_path, sim_host, fakenvml_path, ports
):
    listen, upstream = ports
    starts, closed = tmp_path / "starts", tmp_path / "closed"
    argv = [sys.executable, "-c", ENDING, str(upstream), str(starts), str(closed)]
    async with stack_with(tmp_path, sim_host, fakenvml_path, ports, argv) as stack:
        gate = stack.gate
        url = f"http://127.0.0.1:{listen}"
        assert (await transcribe(url))[0] == 200
        crashes = failures_of(gate, FailureClass.RUNTIME_CRASH)
        process = process_of(stack)
        assert process.pid is not None
        os.kill(process.pid, signal.SIGUSR1)
        await until(closed.exists)
        # Admitted on the process the books say is up; its connection is refused.
        work = asyncio.create_task(transcribe(url))
        await until(lambda: any(lease.key.consumer == "whisper" for lease in gate.core.leases()))
        os.kill(process.pid, signal.SIGUSR2)
        # Before, it waited out the start timeout for a port no process would open, then
        # was answered 502; now the process's end sends it to the next start.
        status, text = await work
        assert status == 200, text
        assert starts.read_text() == "xx"
        assert [e.detail for e in crashes] == [
            f"RUNTIME_CRASH: whisper (http://127.0.0.1:{upstream}): it exited: exit status 1"
        ]
        await until(lambda: gate.core.leases() == [])
        assert gate.core.waiting() == []


async def test_an_always_warm_process_killed_is_started_again_under_a_lease(
    tmp_path, sim_host, fakenvml_path, ports
):
    listen, upstream = ports
    argv = whisper_argv(spec_for(upstream), sim_host.directory)
    warm = "{policy: always_warm}"
    async with stack_with(tmp_path, sim_host, fakenvml_path, ports, argv, residency=warm) as stack:
        gate = stack.gate
        key = ResidentKey("whisper", TURBO)
        process = process_of(stack)
        await until(lambda: gate.core.resident(key) is not None and gate.core.leases() == [])
        await until(lambda: process.running and not gate.processes.starting("whisper"))
        first = process.pid
        assert first is not None
        gone = stack.next_event(EventKind.RESIDENT_GONE, key=key)
        crashes = []
        gate.events.subscribe(lambda e: e.kind is EventKind.FAILURE and crashes.append(e))
        regranted = stack.next_event(EventKind.LEASE_GRANTED, key=key)
        back = stack.next_event(EventKind.LEASE_RELEASED, key=key, reason="resident")
        os.kill(first, signal.SIGKILL)
        # Gone at the child's exit, or at the sample that shows its memory freed first.
        assert (await gone).detail in ("its process ended: killed by SIGKILL (status 137)",
                                       "NVML no longer shows its memory")  # fmt: skip
        assert (await regranted).bytes == WHISPER, "started again under a lease"
        await back
        assert process.running and process.pid != first
        assert pids_holding(stack) == [process.pid]
        assert [e.failure.failure_class for e in crashes] == [FailureClass.RUNTIME_CRASH]
        assert (await transcribe(f"http://127.0.0.1:{listen}"))[0] == 200


MEDIUM = "models/ggml-medium.bin"


async def test_a_load_takes_the_old_models_place_not_memory_beside_it(
    tmp_path, sim_host, fakenvml_path, ports
):
    # whisper-server frees the model it runs before it loads the next: a switch needs the
    # new model's bytes in place of the old one's. Interactive Ollama models (which a
    # background /load may not evict) leave 1.8 GiB beside whisper's 2.0 GiB: 2.4 GiB fit
    # only where the old model was.
    listen, upstream = ports
    spec = attrs.evolve(
        spec_for(upstream), models={TURBO: WHISPER, BASE: SMALL, MEDIUM: 2500 * MiB}
    )
    argv = whisper_argv(spec, sim_host.directory)
    extra = whisper_yaml(listen, upstream, argv, residency=KEEP_WARM, cls="background").replace(
        f"  {BASE}: {{envelope: 200MiB}}\n",
        f"  {BASE}: {{envelope: 200MiB}}\n      {MEDIUM}: {{envelope: 2500MiB}}\n",
    )
    assert MEDIUM in extra
    async with running_stack(tmp_path, sim_host, fakenvml_path, extra=extra) as stack:
        gate = stack.gate
        url = f"http://127.0.0.1:{listen}"
        assert (await transcribe(url))[0] == 200
        async with aiohttp.ClientSession() as session:
            for model in ("gemma3:12b", "llama3.2:3b"):
                body = {"model": model, "prompt": "hi", "stream": False}
                async with session.post(stack.gate_url + "/api/generate", json=body) as resp:
                    assert resp.status == 200, await resp.text()
            budget = gate.core.budget(0)
            assert budget is not None and budget.schedulable < 2500 * MiB
            switched = stack.next_event(
                EventKind.LEASE_RELEASED, key=ResidentKey("whisper", MEDIUM), reason="done"
            )
            form = aiohttp.FormData()
            form.add_field("model", MEDIUM, content_type="text/plain")
            async with session.post(url + "/load", data=form) as resp:
                assert resp.status == 200, await resp.text()
        await switched
        assert gate.core.resident(ResidentKey("whisper", TURBO)) is None
        new = gate.core.resident(ResidentKey("whisper", MEDIUM))
        assert new is not None and new.state is ResidentState.RESIDENT
        await until(lambda: gate.core.budget(0).consumer("whisper").committed == 2500 * MiB)
        ollama = {r.key.model for r in gate.core.residents(0) if r.key.consumer == "ollama"}
        assert ollama == {"gemma3:12b", "llama3.2:3b"}, "nothing evicted for it"
        assert (await transcribe(url))[0] == 200
        assert gate.core.leases() == [] and stack.host.ooms() == []
