"""The registry maps runtime kinds to what builds their runtimes; each runtime is a record
of the parts it has (None for a part it lacks)."""

from __future__ import annotations

from pathlib import Path

import aiohttp
import attrs
import pytest
from aiohttp import web

from gpugate.config.model import Upstream
from gpugate.core.placement import Placing
from gpugate.core.tickets import LeaseScope
from gpugate.runtimes.base import HealthSignal, ReclaimRule, RouteKind, Runtime, placing
from gpugate.runtimes.controlled import ProcessLifecycle
from gpugate.runtimes.http import PassReading
from gpugate.runtimes.ollama.adapter import OllamaReading, ollama_runtime
from gpugate.runtimes.registry import RUNTIMES, runtime_factory, runtime_for
from gpugate.runtimes.sections import RUNTIME_TABLE, load_config
from gpugate.runtimes.whisper.adapter import WhisperReading
from tests.runtimes.test_ollama_adapter import CONSUMER


def test_ollama_consumers_get_the_ollama_runtime():
    runtime = runtime_for(CONSUMER)
    assert isinstance(runtime, Runtime)
    assert isinstance(runtime.reading, OllamaReading)
    assert runtime.settings.consumer is CONSUMER


@pytest.mark.parametrize("kind", RUNTIME_TABLE.names)
def test_every_runtime_kind_is_fronted_by_a_runtime(kind):
    assert runtime_factory(kind) is not None
    assert isinstance(runtime_for(attrs.evolve(CONSUMER, runtime=kind)), Runtime)


@pytest.mark.parametrize(("kind", "cls"), [("whisper", WhisperReading), ("http", PassReading)])
def test_process_runtimes_have_a_lifecycle_and_no_listing(kind, cls):
    runtime = runtime_for(attrs.evolve(CONSUMER, runtime=kind))
    assert runtime is not None
    assert isinstance(runtime.reading, cls)
    assert isinstance(runtime.lifecycle, ProcessLifecycle)
    assert runtime.inventory is None and runtime.jobs is None and runtime.placement is None


def test_the_runtimes_with_a_section_are_the_runtimes_the_registry_builds():
    assert RUNTIME_TABLE.names == tuple(RUNTIMES.factories) and RUNTIMES.table == RUNTIME_TABLE


def test_every_registered_factory_builds_a_runtime():
    for kind, factory in RUNTIMES.factories.items():
        assert isinstance(factory(attrs.evolve(CONSUMER, runtime=kind)), Runtime)


def test_ollamas_parts():
    runtime = ollama_runtime(CONSUMER)
    assert runtime.inventory is not None, "its listing names its memory"
    assert runtime.vetting is not None and runtime.memory is not None
    assert runtime.lifecycle is None and runtime.jobs is None
    assert placing(runtime.placement) is Placing.RUNTIME
    assert runtime.residents.reclaim_rule == ReclaimRule(recovered_fraction=0.75)
    body = b'{"model": "bge-m3", "prompt": "hi"}'
    classified = runtime.reading.classify("POST", "/api/generate", body, "application/json")
    assert classified.kind is RouteKind.DEMAND
    assert classified.scope is LeaseScope.REQUEST


def test_shared_lookups_resolve_names_as_the_runtime_does():
    settings = ollama_runtime(CONSUMER).settings
    # `library/bge-m3:latest` is Ollama's full spelling of `bge-m3`.
    assert settings.model_priority("library/bge-m3:latest") is settings.model_priority("bge-m3")
    assert settings.residency("BGE-M3").ttl == 901.0
    assert settings.configured_envelope("bge-m3") is None
    assert settings.reload_seconds("bge-m3", 2 * 1024**3) == pytest.approx(2.0)


@pytest.mark.parametrize(("status", "healthy"), [(200, True), (500, False)])
async def test_ollama_health_is_api_version(aiohttp_server, status, healthy):
    seen = []

    async def version(request: web.Request) -> web.Response:
        seen.append(request.headers["Host"])
        return web.json_response({"version": "0.33.0"}, status=status)

    app = web.Application()
    app.router.add_get("/api/version", version)
    server = await aiohttp_server(app)
    consumer = attrs.evolve(CONSUMER, upstream=Upstream("http", "127.0.0.1", server.port))
    async with aiohttp.ClientSession() as session:
        assert await ollama_runtime(consumer).health.check(session) is healthy
    assert seen == [f"127.0.0.1:{server.port}"]


def test_a_runtime_the_gate_only_fronts_never_fails_health_by_a_guessed_route():
    # The demo's mVoice: `runtime: http`, no control, no known health route.
    config = load_config(Path(__file__).parents[2] / "gpugate/sim/data/demo-consumers.yaml")
    signals = {
        c.name: runtime.health.signal
        for c in config.consumers
        if (runtime := runtime_for(c)) is not None
    }
    assert signals["mvoice"] is HealthSignal.UNOBSERVED
    assert signals["whisper"] is HealthSignal.PROCESS
    assert signals["ollama"] is HealthSignal.LISTING
