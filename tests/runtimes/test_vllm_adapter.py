"""vLLM's runtime and its sleep control: which routes need it awake, how it is put to sleep
and woken (level 1 and 2), and what an answer it cannot read becomes."""

from __future__ import annotations

from pathlib import Path

import pytest
from aiohttp import web

from gpugate.config.loader import ConfigError
from gpugate.core.lifecycle import LifeReport
from gpugate.runtimes.base import ApiFamily, RouteKind, error_reply
from gpugate.runtimes.process import ProcessControlError
from gpugate.runtimes.registry import runtime_for
from gpugate.runtimes.sections import load_config_text
from gpugate.runtimes.vllm.adapter import VllmReading
from gpugate.runtimes.vllm.sleep import SleepMode

CONFIG = """\
consumers:
  vllm:
    runtime: vllm
    listen: 127.0.0.1:8000
    upstream: http://127.0.0.1:8001
    envelope: 7GiB
    sleep_level: 2
    models: {qwen: {envelope: 7GiB}}
"""


def test_the_runtime_sleeps_at_its_level_and_wakes_for_generation_routes():
    (consumer,) = load_config_text(CONFIG, "consumers.yaml").consumers
    runtime = runtime_for(consumer)
    assert runtime is not None and isinstance(runtime.reading, VllmReading)
    lifecycle = runtime.lifecycle
    assert isinstance(lifecycle.control, SleepMode) and lifecycle.control.level == 2
    assert not SleepMode.owns_port  # its port stays open while it sleeps
    assert lifecycle.process_model() == "qwen"
    assert lifecycle.needs_process("POST", "/v1/chat/completions")
    assert lifecycle.needs_process("POST", "/v1/embeddings")
    for method, path in (("GET", "/health"), ("GET", "/v1/models"), ("POST", "/tokenize")):
        assert not lifecycle.needs_process(method, path)
    classified = runtime.reading.classify("POST", "/v1/chat/completions", None, "")
    assert (classified.kind, classified.api) == (RouteKind.PASS, ApiFamily.VLLM)


def test_a_sleep_level_other_than_1_or_2_or_no_envelope_is_a_config_error():
    text = CONFIG.replace("sleep_level: 2", "sleep_level: 3").replace("    envelope: 7GiB\n", "")
    with pytest.raises(ConfigError) as info:
        load_config_text(text, Path("consumers.yaml"))
    found = [(i.line, i.path) for i in info.value.errors]
    # A missing key is reported at its consumer's line; the bad level at its own.
    assert found == [(2, "consumers.vllm.envelope"), (6, "consumers.vllm.sleep_level")]
    assert "1 or 2" in info.value.errors[1].message


def test_the_gates_errors_are_in_vllms_shape():
    reply = error_reply(ApiFamily.VLLM, 503, "no room")
    assert reply.body == (
        b'{"error":{"message":"no room","type":"ServiceUnavailableError","param":null,"code":503}}'
    )
    assert reply.content_type == "application/json"


async def fake_vllm(aiohttp_server, *, sleep_status: int = 200, is_sleeping: object = True):
    calls: list[str] = []

    async def record(request: web.Request) -> web.Response:
        body = await request.text()
        calls.append(f"{request.method} {request.path_qs} {body}".strip())
        if request.path == "/sleep":
            return web.Response(status=sleep_status, text="" if sleep_status == 200 else "no")
        if request.path.startswith("/nothing-here"):
            return web.json_response({"detail": "Not Found"}, status=404)
        if request.path == "/is_sleeping":
            return web.json_response({"is_sleeping": is_sleeping})
        return web.Response(status=200)

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", record)
    server = await aiohttp_server(app)
    return f"http://127.0.0.1:{server.port}", calls


async def test_level_two_wakes_weights_reloads_them_then_the_kv_cache(aiohttp_server):
    url, calls = await fake_vllm(aiohttp_server)
    control = SleepMode(url, level=2, timeout=5)
    await control.sleep()
    await control.wake()
    assert calls == [
        "POST /sleep?level=2",
        "POST /wake_up?tags=weights",
        'POST /collective_rpc {"method": "reload_weights"}',
        "POST /wake_up?tags=kv_cache",
    ]
    assert await control.is_running() is False  # the fake says it sleeps
    assert await control.probe() is LifeReport.FOUND_ASLEEP


async def test_level_one_wakes_in_one_call(aiohttp_server):
    url, calls = await fake_vllm(aiohttp_server, is_sleeping=False)
    control = SleepMode(url, level=1, timeout=5)
    await control.sleep()
    await control.wake()
    assert calls == ["POST /sleep?level=1", "POST /wake_up"]
    assert await control.is_running() is True
    assert await control.probe() is LifeReport.FOUND_UP


async def test_it_is_never_started_or_stopped_by_the_gate(aiohttp_server):
    url, calls = await fake_vllm(aiohttp_server)
    control = SleepMode(url, timeout=5)
    for call in (control.start, control.stop):
        with pytest.raises(ProcessControlError, match="not the gate's to start or stop"):
            await call()
    assert calls == []
    assert control.sleeps


async def test_a_refused_sleep_or_an_unreadable_state_is_a_control_error(aiohttp_server):
    url, _ = await fake_vllm(aiohttp_server, sleep_status=400, is_sleeping="maybe")
    control = SleepMode(url, timeout=5)
    with pytest.raises(ProcessControlError, match="400"):
        await control.sleep()
    with pytest.raises(ProcessControlError, match="is_sleeping"):
        await control.is_running()
    gone = SleepMode(url + "/nothing-here", timeout=5)
    with pytest.raises(ProcessControlError, match="VLLM_SERVER_DEV_MODE"):
        await gone.is_running()
    nowhere = SleepMode("http://127.0.0.1:9", timeout=2)
    with pytest.raises(ProcessControlError):
        await nowhere.wake()
